"""The public API lock: what ``import stoker`` offers, and what ``stoker.DataLoader`` accepts.

Changing any of this is an API change: update the lists here in the same commit, on purpose.

What counts as public in the ``stoker`` namespace (the rule the tests enforce):

* every name in ``stoker.__all__`` is public, and nothing else is;
* an attribute of the ``stoker`` module whose name does not start with ``_`` must be in
  ``__all__``, unless it is a submodule of stoker (``stoker.loader``, ``stoker.collate``, ...):
  importing ``stoker.x`` binds ``x`` in the package namespace as a side effect, which does not
  make the module part of the API. A submodule that *is* public (``formats``, ``sharing``) is
  listed in ``__all__`` explicitly. Any other module object (``os``, ``torch``) imported into the
  namespace without an underscore is a leak and fails;
* dunders (``__version__``, ``__all__``, ...) are not API names.
"""

from __future__ import annotations

import inspect
import re
import types

import pytest
import torch.utils.data

import stoker

# name -> what it is. Sorted by name.
PUBLIC = {
    "BatchDeviceError": "exception",
    "CopyOnReadWarning": "warning",
    "CudaInWorkersError": "exception",
    "DataLoader": "class",
    "DeviceUnavailableError": "exception",
    "EndOfData": "class",
    "LoaderTimeoutError": "exception",
    "Mix": "class",
    "MixedDeviceError": "exception",
    "PackError": "exception",
    "PackInterrupted": "exception",
    "Plan": "class",
    "RemoteReadError": "exception",
    "RemoteTraceback": "exception",
    "ShardError": "exception",
    "SkipBudgetExceeded": "exception",
    "StallWarning": "warning",
    "StatefulDataLoader": "class",
    "StatsHook": "class",
    "StokerError": "exception",
    "SupportsEpoch": "class",
    "SupportsFetchForBatch": "class",
    "SupportsFetchForStream": "class",
    "SupportsPrepareBatch": "class",
    "SupportsShareLists": "class",
    "SupportsTensorIndex": "class",
    "SupportsThreadSafe": "class",
    "WorkerDiedError": "exception",
    "WorkerError": "exception",
    "default_collate": "function",
    "default_convert": "function",
    "formats": "module",
    "get_worker_info": "function",
    "image": "module",
    "sample_generator": "function",
    "sample_rng": "function",
    "sample_seed": "function",
    "sharing": "module",
    "storage": "module",
}

# stoker.DataLoader's own keyword-only arguments (after torch's) and their defaults, in order.
EXTRAS = {
    "snapshot_every_n_steps": 1,  # torchdata StatefulDataLoader's (accepted, changes nothing)
    "seeding": None,  # torch's per-worker seeding unless beyond_torch asks for per-batch
    "beyond_torch": None,  # NOTE [ Same as torch unless asked ]: STOKER_BEYOND_TORCH, else off
    "stall_warning_s": 300.0,
    "shard": False,
    "shard_even": "pad",
    "on_error": "raise",
    "skip_budget": 0.01,
    "worker_type": "auto",
    "worker_concurrency": "auto",
    "fast_paths": True,
    "collect_stats": True,
    "device": None,
    "device_prefetch": 1,
    "device_transform": None,
}
# Extras the DataLoader docstring does not describe yet. Remove a name once it is documented
# (the xfail is strict: a documented name listed here fails the run).
UNDOCUMENTED: set[str] = set()


def kind_of(obj: object) -> str:
    if isinstance(obj, types.ModuleType):
        return "module"
    if isinstance(obj, type):
        if issubclass(obj, Warning):
            return "warning"
        return "exception" if issubclass(obj, BaseException) else "class"
    if callable(obj):
        return "function"
    return type(obj).__name__


# -------------------------------------------------------------------------------- namespace


def test_all_is_the_locked_list():
    assert list(PUBLIC) == sorted(PUBLIC)  # keep the lock itself sorted
    assert len(set(stoker.__all__)) == len(stoker.__all__), "duplicates in stoker.__all__"
    assert sorted(stoker.__all__) == list(PUBLIC)


@pytest.mark.parametrize("name", list(PUBLIC))
def test_public_name_imports_and_is_what_it_was(name):
    namespace: dict[str, object] = {}
    exec(f"from stoker import {name}", namespace)
    obj = namespace[name]
    assert obj is getattr(stoker, name)
    assert kind_of(obj) == PUBLIC[name], f"stoker.{name} is now a {kind_of(obj)}"
    # Defined by stoker (or, for get_worker_info, a stoker function returning torch's record).
    module = obj.__name__ if isinstance(obj, types.ModuleType) else obj.__module__
    assert module == "stoker" or module.startswith("stoker."), f"{name} comes from {module}"


def test_star_import_gives_exactly_all():
    namespace: dict[str, object] = {}
    exec("from stoker import *", namespace)
    namespace.pop("__builtins__", None)
    assert sorted(namespace) == list(PUBLIC)


def test_nothing_public_is_missing_from_all():
    exported = set(stoker.__all__)
    missing = []
    for name, obj in vars(stoker).items():
        if name.startswith("_") or name in exported:
            continue
        is_submodule = isinstance(obj, types.ModuleType) and obj.__name__.startswith("stoker.")
        if not is_submodule:
            missing.append(f"{name} ({kind_of(obj)})")
    assert not missing, (
        f"public names in the stoker namespace but not in stoker.__all__: {missing}; export "
        "them (and add them to PUBLIC here) or rename them with a leading underscore"
    )


def test_exceptions_keep_their_hierarchy():
    """``except stoker.StokerError`` (or ``RuntimeError``, where torch raised one) catches
    every loader error; ``RemoteTraceback`` only carries a worker's traceback as ``__cause__``."""
    assert issubclass(stoker.StokerError, RuntimeError)
    assert issubclass(stoker.RemoteTraceback, Exception)
    assert not issubclass(stoker.RemoteTraceback, stoker.StokerError)
    errors = [n for n, kind in PUBLIC.items() if kind == "exception"]
    others = set(errors) - {"StokerError", "RemoteTraceback", "PackInterrupted"}
    assert others and all(issubclass(getattr(stoker, n), stoker.StokerError) for n in others)
    # Ctrl-C stays a KeyboardInterrupt: code that stops on it still does
    assert issubclass(stoker.PackInterrupted, KeyboardInterrupt)
    warns = [n for n, kind in PUBLIC.items() if kind == "warning"]
    assert warns and all(issubclass(getattr(stoker, n), UserWarning) for n in warns)


# Exception classes that never reach a user: signals inside one module, caught there.
_INTERNAL_SIGNALS = {
    "stoker.fastpaths.batched_columns.Decline",  # the batched form declines a batch
    "stoker.transport.slab_writer.SlabFull",  # a batch outgrows its slab: a bigger one is made
    "stoker.storage.retry.TruncatedRead",  # a short body: retried; the final error chains it
    "stoker.storage.retry.RangeIgnored",  # a whole object for a range: the final error chains it
    "stoker.storage.exit_watch.DownloadAborted",  # a download in flight as its process exits
}


def test_every_exception_and_warning_class_lives_in_errors_and_is_exported():
    import importlib
    import pkgutil

    import stoker.errors

    found = []
    for info in pkgutil.walk_packages(stoker.__path__, "stoker."):
        if info.name.startswith(("stoker.cli", "stoker.doctor", "stoker.integrations")) or (
                info.name.endswith("__main__")):
            continue  # commands (their errors end as a message and an exit code); frameworks
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional extra that is not installed
            continue
        for name, obj in vars(module).items():
            if isinstance(obj, type) and issubclass(obj, BaseException) and (
                    obj.__module__ == info.name and not name.startswith("_")
                    and info.name != "stoker.errors"):
                found.append(f"{info.name}.{name}")
    assert sorted(set(found) - _INTERNAL_SIGNALS) == []
    in_errors = {n for n, obj in vars(stoker.errors).items()
                 if isinstance(obj, type) and issubclass(obj, BaseException)
                 and obj.__module__ == "stoker.errors"}
    assert in_errors == {n for n, kind in PUBLIC.items() if kind in ("exception", "warning")}


# -------------------------------------------------------------------------------- DataLoader


def _params(fn: object) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]


def test_dataloader_is_a_torch_dataloader():
    assert issubclass(stoker.DataLoader, torch.utils.data.DataLoader)


def test_stateful_dataloader_is_stokers_dataloader_under_torchdatas_name():
    assert issubclass(stoker.StatefulDataLoader, stoker.DataLoader)
    assert _params(stoker.StatefulDataLoader.__init__) == _params(stoker.DataLoader.__init__)


def test_torch_parameters_keep_torchs_names_order_kinds_and_defaults():
    theirs = _params(torch.utils.data.DataLoader.__init__)
    ours = _params(stoker.DataLoader.__init__)[: len(theirs)]
    # Annotations are not compared: stoker's are postponed strings (from __future__).
    assert [(p.name, p.kind, p.default) for p in ours] == [
        (p.name, p.kind, p.default) for p in theirs
    ]


def test_extras_are_exactly_the_locked_keyword_only_set():
    torch_names = {p.name for p in _params(torch.utils.data.DataLoader.__init__)}
    extras = [p for p in _params(stoker.DataLoader.__init__) if p.name not in torch_names]
    assert [(p.name, p.default) for p in extras] == list(EXTRAS.items())
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extras), [
        (p.name, p.kind.description) for p in extras
    ]
    # ... and they come after every torch parameter.
    names = [p.name for p in _params(stoker.DataLoader.__init__)]
    assert names[len(torch_names) :] == list(EXTRAS)


def test_class_signature_is_the_constructors():
    """``inspect.signature(stoker.DataLoader)`` (what IDEs and Lightning show) lists them."""
    assert [p.name for p in _params(stoker.DataLoader)] == [
        p.name for p in _params(stoker.DataLoader.__init__)
    ]


def test_default_construction_matches_torch_attributes():
    dataset = list(range(4))
    ours, theirs = stoker.DataLoader(dataset), torch.utils.data.DataLoader(dataset)
    for attr in (
        "batch_size", "num_workers", "pin_memory", "drop_last", "timeout", "prefetch_factor",
        "persistent_workers", "pin_memory_device", "in_order", "multiprocessing_context",
    ):
        assert getattr(ours, attr) == getattr(theirs, attr), attr


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            name,
            marks=pytest.mark.xfail(
                strict=True, reason=f"{name} is not described in DataLoader's docstring yet"
            ),
        )
        if name in UNDOCUMENTED
        else name
        for name in EXTRAS
    ],
)
def test_extra_is_documented(name):
    """Each extra has an entry (``name: ...`` at the start of a line) in the class docstring."""
    doc = inspect.getdoc(stoker.DataLoader) or ""
    assert re.search(rf"^{re.escape(name)}:", doc, re.MULTILINE), (
        f"stoker.DataLoader's docstring does not describe {name}="
    )


# Public subpackages whose own __all__ is part of the API. name -> locked __all__.
SUBPACKAGES = {
    "image": ["DecodeImages", "decode_box_into", "decode_crop_into", "random_resized_crop_box"],
    "storage": [
        "ByteSource", "ByteSourceExtras", "LocalSource", "RemoteReadError", "RemoteSource",
        "RetryPolicy", "ShardCache", "open_source",
    ],
}


@pytest.mark.parametrize("name", list(SUBPACKAGES))
def test_subpackage_all_is_locked(name):
    module = getattr(stoker, name)
    assert sorted(module.__all__) == sorted(SUBPACKAGES[name])
    for attr in module.__all__:
        # Defined in the subpackage, or an exception re-exported from stoker.errors.
        assert getattr(module, attr).__module__.startswith((f"stoker.{name}", "stoker.errors"))


# -------------------------------------------------------------------------------- stats()

# What ``loader.stats()`` returns is API too (its fields are read by users' loggers through
# ``as_dict()``): the record's fields in order, and the named parts of ``worker_times``.
STATS_FIELDS = [
    "batches", "samples", "skipped", "empty_batches", "num_workers", "wait_s", "loop_s",
    "fetch_wall_s", "fetch_cpu_s", "collate_s", "pack_s", "unpack_s", "pin_s", "to_device_s",
    "device_transform_s", "device_copy_s", "device_wait_s", "device_bytes", "device_batches",
    "fetch_queued_s",
    "cpu_steal_share", "main_cpu_s", "main_queued_s", "worker_times", "cpu_idle_share",
    "queue_measured", "batched", "gathered_in_main", "inline", "threads", "tasks_moved",
    "tasks_loaded_twice",
    "concurrency", "tuner", "beyond_torch", "advice", "summary",
]
WORKER_TIMES_FIELDS = ("fetch_wall_s", "fetch_cpu_s", "queued_s", "collate_pack_s")


def test_stats_record_fields_are_locked():
    import dataclasses

    stats = stoker.DataLoader(list(range(4)), batch_size=2).stats()
    assert [f.name for f in dataclasses.fields(stats)] == STATS_FIELDS
    from stoker._core.stats import WorkerTimes

    assert WorkerTimes._fields == WORKER_TIMES_FIELDS
    assert issubclass(WorkerTimes, tuple)  # unpacking as four numbers keeps working
