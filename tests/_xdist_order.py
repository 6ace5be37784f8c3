"""The order test files start in when the suite runs in several pytest processes.

``scripts/test.sh`` runs pytest-xdist with ``--dist loadfile``: a free process takes the next
file in collection order. In collection order the framework files (ranks launched with
``torchrun``, each importing Lightning or Accelerate) come last, and in a quiet fresh-clone run
(2026-12-02, 16 min 17 s) one process worked through them alone for the last minutes. Started
longest first (the longest-processing-time rule), the processes end close together.

``HEAVIEST`` lists the files by their time in a quiet one-process run (``--durations=0``,
2026-12-02 at 2624cc6), longest first; a file not listed keeps its place after them. A stale
entry costs only balance; ``tests/unit/test_xdist_order.py`` checks each names a file.
"""

from __future__ import annotations

import pytest

HEAVIEST: tuple[str, ...] = (
    "tests/contract/test_differential_fuzz.py",  # 237 s
    "tests/integration/test_doctor_cli.py",  # 208 s (before two tests were folded)
    "tests/integration/test_remote_storage.py",  # 100 s
    "tests/integration/frameworks/test_lightning_resume.py",  # 98 s
    "tests/integration/test_benchmarks_smoke.py",  # 60 s
    "tests/integration/frameworks/test_accelerate.py",  # 54 s
    "tests/integration/test_workers.py",  # 40 s
    "tests/docs/test_examples.py",  # 39 s
    "tests/integration/frameworks/test_lightning.py",  # 39 s
    "tests/integration/test_worker_process_as_torch.py",  # 38 s
    "tests/contract/test_resume_contract.py",  # 30 s
    "tests/integration/test_differential.py",  # 29 s
    "tests/unit/test_vision_compose.py",  # 27 s
    "tests/docs/test_site.py",  # 24 s
    "tests/soak/test_soak.py",  # 24 s
    "tests/integration/test_suite_timeouts.py",  # 24 s
    "tests/integration/test_remote_pieces.py",  # 23 s
    "tests/integration/test_wheel_install.py",  # 22 s
    "tests/integration/test_pickle_once.py",  # 21 s
    "tests/integration/test_voice_as_torch.py",  # 21 s
    "tests/unit/test_collate_hypothesis.py",  # 21 s
    "tests/integration/test_shared_list_workers.py",  # 20 s
    "tests/integration/test_remote_obstore.py",  # 18 s
    "tests/integration/test_cli_errors.py",  # 17 s
)


def heaviest_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: ``HEAVIEST``'s files first, in its order; the rest after,
    in their collected order (a file's own tests keep theirs)."""
    rank = {path: k for k, path in enumerate(HEAVIEST)}

    def key(pair: tuple[int, pytest.Item]) -> tuple[int, int]:
        index, item = pair
        return rank.get(item.nodeid.partition("::")[0], len(rank)), index

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]
