"""The fast tier: what ``scripts/test.sh --fast`` runs before each commit, in one place.

The full suite (``scripts/test.sh``, what CI runs) takes ~15 minutes on two cores; the fast
tier is a curated selection that runs in under 3 minutes there and still touches every
module's contract: the differential fuzzer's bounded run (a smaller budget: ``fast_tier``),
the same-as-torch cases, the wire protocol between the main process and its workers, resume,
errors, the public API and the layers. It is selected by the ``fast`` marker, which the root
conftest puts on every test named in ``FAST`` (a file, or a file's test, with or without its
parameters), and run in either of these ways:

* ``scripts/test.sh --fast`` (sets ``STOKER_FAST=1``; the root conftest then deselects the
  rest);
* ``STOKER_FAST=1 .venv/bin/python -m pytest`` or ``-m fast`` (``-m fast`` keeps the fuzzer's
  full budget unless ``STOKER_FAST`` is set or the expression names ``fast``).

An entry is chosen for what it proves per second: unit files that run no processes, and from
the integration suite the few tests per contract that start workers once. Measured times are
on a quiet 2-core machine (``--durations``); ``tests/unit/test_fast_tier.py`` checks that every
entry still names an existing file and test.
"""

from __future__ import annotations

import os

import pytest

FAST_ENV = "STOKER_FAST"

# (entry, why): an entry is ``path`` or ``path::test_name`` (every parametrization of it).
FAST: tuple[tuple[str, str], ...] = (
    # -- same as torch, end to end: the fuzzer, with the fast tier's budget
    ("tests/contract/test_differential_fuzz.py::test_stoker_matches_torch",
     "the differential fuzzer's bounded run (FAST_FUZZ_EXAMPLES / FAST_FUZZ_BUDGET_S)"),
    ("tests/contract/test_differential_fuzz.py::test_every_known_difference_has_a_minimal_case",
     "the known differences' bookkeeping"),
    ("tests/integration/test_same_as_torch.py", "user code that must behave as under torch"),
    ("tests/integration/test_same_as_torch_by_default.py",
     "defaults give torch's observable results"),
    # -- the public API and the package's shape
    ("tests/contract/test_public_api.py", "the public surface lock"),
    ("tests/contract/test_state_keys.py", "the state_dict's keys"),
    ("tests/unit/test_layers.py", "the layer map: every import within its layer"),
    ("tests/unit/test_import_cycles.py", "no import cycles"),
    ("tests/unit/test_fast_tier.py", "this list names what exists"),
    ("tests/unit/test_no_sleeps.py", "no test waits by sleeping"),
    # -- the wire protocol and transport (main process <-> workers)
    ("tests/unit/test_protocol.py", "the worker protocol's messages"),
    ("tests/unit/test_transport.py", "slabs: pack and rebuild a batch"),
    ("tests/unit/test_contracts.py", "the named Protocols between parts"),
    # -- collate, sampling, seeding: the unit contracts
    ("tests/unit/test_collate.py", "default_collate as torch's"),
    ("tests/unit/test_sharded_sampler.py", "sharding across ranks"),
    ("tests/unit/test_seed_values.py", "torch's seeding contract"),
    ("tests/unit/test_worker_rngs.py", "workers' RNG streams"),
    ("tests/unit/test_plan.py", "the frozen plan"),
    ("tests/unit/test_task_book.py", "ordered delivery's bookkeeping"),
    # -- resume
    ("tests/unit/test_engine_state.py", "the engine's resume state"),
    ("tests/unit/test_sample_index_cursor.py", "the cursor that owns an epoch's position"),
    ("tests/contract/test_resume_contract.py::test_map_style_two_workers",
     "resume mid-epoch with workers, every step"),
    ("tests/contract/test_resume_contract.py::test_resume_with_different_num_workers",
     "resume across num_workers (per-batch seeding)"),
    ("tests/contract/test_resume_contract.py::test_iterable_dataset", "resume an iterable"),
    ("tests/contract/test_resume_contract.py::test_helper_names_what_broke",
     "the resume helper catches each kind of broken loader"),
    # -- errors
    ("tests/integration/test_exceptions.py::test_custom_exception_keeps_type_and_attributes",
     "a worker's exception keeps its type and attributes"),
    ("tests/integration/test_exceptions.py::test_error_names_worker_indices_and_keeps_traceback",
     "the sample index, the worker id, the traceback"),
    ("tests/integration/test_worker_errors_catchable.py", "errors a user can catch"),
    ("tests/integration/test_exceptions.py::test_builtin_exceptions_in_getitem",
     "built-in exceptions from workers, as without"),
    ("tests/integration/test_exceptions.py::test_new_epoch_after_an_error",
     "the loader goes on after an error"),
    # -- formats, storage, mixing, sharing, device feed, profiling, doctor, vision: one
    #    process each, milliseconds a test
    ("tests/unit/test_tar_shards.py", "tar shards: index, random reads, errors"),
    ("tests/unit/test_tar_members.py", "tar members"),
    ("tests/unit/test_format_readers.py", "every record format's reader"),
    ("tests/unit/test_pack_records.py", "pack: what it writes"),
    ("tests/unit/test_shard_cache.py", "the shard cache"),
    ("tests/unit/test_storage_retry.py", "remote reads: retries and their errors"),
    ("tests/unit/test_mix.py", "mixing datasets and its resume"),
    ("tests/unit/test_shared_list.py", "lists shared with workers"),
    ("tests/unit/test_auto_share.py", "what is shared automatically"),
    ("tests/unit/test_fast_batches.py", "batched fast paths"),
    ("tests/unit/test_batched_getitem.py", "__getitems__"),
    ("tests/unit/test_torch_datasets_gather.py", "torch's own datasets, gathered"),
    ("tests/unit/test_device_feed.py", "the device feed (fake device)"),
    ("tests/unit/test_host_pins.py", "pinned host buffers"),
    ("tests/unit/test_prepare_batch.py", "prepare_batch"),
    ("tests/unit/test_stats_hooks.py", "stats() and its hooks"),
    ("tests/unit/test_verdict.py", "the input-bound verdict"),
    ("tests/unit/test_doctor_parts.py", "the doctor's parts"),
    ("tests/unit/test_vision_transforms.py", "stoker.vision transforms as torchvision's"),
    ("tests/integration/test_torch_way_transport.py", "torch's transport through workers"),
    ("tests/integration/test_tar_stream.py", "tar streams across workers"),
    # -- workers end to end, once each
    ("tests/integration/test_workers.py::test_get_worker_info_inside_workers",
     "get_worker_info() in workers"),
    ("tests/integration/test_workers.py::test_each_batch_is_loaded_by_torchs_worker",
     "batch k from worker k mod num_workers, as torch"),
    ("tests/integration/test_workers.py::test_worker_seeds_and_rng_draws_match_torch",
     "torch's seeding contract in workers"),
    ("tests/integration/test_workers.py::test_exception_in_worker_init_fn_surfaces",
     "a worker_init_fn error"),
    ("tests/integration/test_workers.py::test_timeout_raises_torchs_runtime_error",
     "timeout= as torch"),
    ("tests/integration/test_workers.py::test_in_order_false_same_multiset_as_in_order",
     "in_order=False delivery"),
    ("tests/integration/test_workers.py::test_break_mid_epoch_then_delete", "shutdown on break"),
)


def fast_requested(config: pytest.Config) -> bool:
    """Whether this run is the fast tier: ``STOKER_FAST`` set (``scripts/test.sh --fast``), or
    a ``-m`` expression naming ``fast`` other than ``not fast``."""
    if os.environ.get(FAST_ENV, "").strip() not in ("", "0"):
        return True
    markexpr = config.getoption("markexpr", default="") or ""
    return "fast" in markexpr and "not fast" not in markexpr


def in_fast_tier(nodeid: str) -> bool:
    for entry, _ in FAST:
        if nodeid == entry or nodeid.startswith((entry + "::", entry + "[")):
            return True
    return False


def mark_fast(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the fast tier's tests; under ``STOKER_FAST`` deselect the rest."""
    keep, drop = [], []
    for item in items:
        if in_fast_tier(item.nodeid):
            item.add_marker(pytest.mark.fast)
            keep.append(item)
        else:
            drop.append(item)
    if os.environ.get(FAST_ENV, "").strip() not in ("", "0") and drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
