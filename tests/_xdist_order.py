"""The order test files start in when the suite runs in several pytest processes.

``scripts/test.sh`` runs pytest-xdist with ``--dist loadfile``: a free process takes the next
file in collection order. In collection order the framework files (ranks launched with
``torchrun``, each importing Lightning or Accelerate) come last, and in a quiet fresh-clone run
(2026-12-02, 16 min 17 s) one process worked through them alone for the last minutes. Started
longest first (the longest-processing-time rule), the processes end close together.

``HEAVIEST`` lists the files by their summed test time in a full three-process run
(``--junitxml``, 2026-12-03 at 8af2b35: 3,356 s of test time, 1,168 s by the clock), longest
first; a file not listed keeps its place after them. A stale
entry costs only balance; ``tests/unit/test_xdist_order.py`` checks each names a file.

pytest-xdist's file scheduler does not take files in collection order by default: it sorts
them by their number of tests, most first (``--loadscope-reorder``, on unless
``--no-loadscope-reorder``). The heaviest files have few tests each (three in
``test_lightning_resume.py``), so they went last: in a quiet three-process run (2026-12-03,
804 s) ``test_lightning_resume.py`` started at 607 s and ``test_benchmarks_smoke.py`` at 609 s,
and the run ended ~200 s after them. ``keep_collection_order`` turns the sorting off in the
process that schedules (the root conftest's ``pytest_configure``), so the order above holds
however pytest was started.
"""

from __future__ import annotations

import pytest

HEAVIEST: tuple[str, ...] = (
    "tests/contract/test_differential_fuzz.py",  # 386 s
    "tests/integration/frameworks/test_lightning_resume.py",  # 318 s
    "tests/integration/test_doctor_cli.py",  # 238 s
    "tests/integration/test_worker_process_as_torch.py",  # 204 s
    "tests/integration/test_benchmarks_smoke.py",  # 179 s
    "tests/integration/test_remote_storage.py",  # 166 s
    "tests/integration/frameworks/test_lightning.py",  # 163 s
    "tests/integration/frameworks/test_accelerate.py",  # 114 s
    "tests/contract/test_resume_contract.py",  # 98 s
    "tests/integration/test_differential.py",  # 94 s
    "tests/docs/test_examples.py",  # 91 s
    "tests/integration/test_pickle_once.py",  # 71 s
    "tests/docs/test_site.py",  # 62 s
    "tests/soak/test_soak.py",  # 55 s
    "tests/integration/test_lazy_imports.py",  # 51 s
    "tests/integration/test_shared_list_workers.py",  # 48 s
    "tests/integration/test_gpu_feed_dry_run.py",  # 44 s
    "tests/integration/test_remote_obstore.py",  # 39 s
    "tests/integration/test_cli_demo.py",  # 37 s
    "tests/contract/test_mix_resume.py",  # 37 s
    "tests/integration/test_voice_as_torch.py",  # 36 s
    "tests/integration/test_cli_errors.py",  # 35 s
    "tests/integration/test_file_descriptors.py",  # 34 s
    "tests/integration/test_remote_pieces.py",  # 34 s
    "tests/integration/test_workers.py",  # 33 s
)


def keep_collection_order(config: pytest.Config) -> None:
    """Have pytest-xdist hand out files in collection order (the order ``heaviest_first``
    made), not sorted by their number of tests."""
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist is installed
        config.option.loadscopereorder = False


def heaviest_first(items: list[pytest.Item], heaviest: tuple[str, ...] = HEAVIEST) -> None:
    """Reorder ``items`` in place: ``heaviest``'s files first, in its order; the rest after,
    in their collected order (a file's own tests keep theirs)."""
    rank = {path: k for k, path in enumerate(heaviest)}

    def key(pair: tuple[int, pytest.Item]) -> tuple[int, int]:
        index, item = pair
        return rank.get(item.nodeid.partition("::")[0], len(rank)), index

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]
