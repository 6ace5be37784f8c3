"""Datasets, samplers, collate functions and exceptions for the integration tests.

Everything here is module-level so that it pickles by reference: workers started with
``spawn`` or ``forkserver`` import this module as ``_datasets`` (tests/integration is on the
sys.path they inherit). Blocking calls take a timeout so that a broken loader fails a test
instead of hanging it.
"""

from __future__ import annotations

import functools
import json
import os
import random
import threading
import time
from collections import namedtuple
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info
from torch.utils.data._utils.collate import collate, default_collate_fn_map

# Long enough never to fire in a passing test, short enough to end a broken one.
BLOCK_TIMEOUT_S = 30.0

# --------------------------------------------------------------------------------------------
# Sample structures
# --------------------------------------------------------------------------------------------

Point = namedtuple("Point", ["x", "y"])

STRUCTURES = ("tensor", "numpy", "dict", "namedtuple", "nested_list", "str", "custom")


class Custom:
    """A user type that default_collate does not know; collated through a collate map."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is Custom and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"Custom({self.value!r})"


class CustomBatch:
    """What ``collate_custom`` makes of a sequence of ``Custom`` values."""

    __slots__ = ("values",)

    def __init__(self, values: list) -> None:
        self.values = values

    def __eq__(self, other: object) -> bool:
        return type(other) is CustomBatch and other.values == self.values

    def __hash__(self) -> int:
        return hash(tuple(self.values))

    def __repr__(self) -> str:
        return f"CustomBatch({self.values!r})"


def collate_custom(batch: Sequence, *, collate_fn_map: dict | None = None) -> CustomBatch:
    # A list of Custom with auto-batching; one sample ``(Custom(i), i)`` with batch_size=None.
    return CustomBatch([b.value if isinstance(b, Custom) else b for b in batch])


CUSTOM_COLLATE_MAP: dict = {**default_collate_fn_map, Custom: collate_custom}


def custom_collate_fn() -> functools.partial:
    """``collate`` with the map above, the documented way to extend default_collate."""
    return functools.partial(collate, collate_fn_map=CUSTOM_COLLATE_MAP)


def make_sample(structure: str, i: int) -> Any:
    if structure == "tensor":
        return torch.arange(3, dtype=torch.float32) + i
    if structure == "numpy":
        return np.array([[i, i + 0.5]], dtype=np.float64)
    if structure == "dict":
        return {"idx": i, "x": torch.full((2,), float(i)), "name": f"s{i}", "half": i / 2}
    if structure == "namedtuple":
        return Point(x=i, y=torch.tensor([i, -i], dtype=torch.int32))
    if structure == "nested_list":
        return [i, [float(i), torch.tensor([i], dtype=torch.int16)], (i % 3, "t")]
    if structure == "str":
        return f"sample-{i}"
    if structure == "custom":
        return (Custom(i), i)
    raise ValueError(f"unknown structure {structure!r}")


def collate_fn_for(structure: str) -> Any:
    """The collate_fn a structure needs (None: the loader's default)."""
    return custom_collate_fn() if structure == "custom" else None


# --------------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------------


class MapDS(Dataset):
    def __init__(self, n: int = 23, structure: str = "tensor") -> None:
        self.n = n
        self.structure = structure

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return make_sample(self.structure, int(i))


class GetItemsDS(MapDS):
    """Batched fetch: samples say which path produced them, so both loaders must agree."""

    def __getitem__(self, i: int) -> Any:
        return ("getitem", super().__getitem__(i))

    def __getitems__(self, indices: list[int]) -> list:
        return [("getitems", super(GetItemsDS, self).__getitem__(i)) for i in indices]


class _WorkerShard:
    @staticmethod
    def shard() -> tuple[int, int]:
        info = get_worker_info()
        return (0, 1) if info is None else (info.id, info.num_workers)


class ShardedIterDS(IterableDataset, _WorkerShard):
    """Each worker yields its share (i % num_workers == id): every element once in total."""

    def __init__(self, n: int = 23, structure: str = "tensor") -> None:
        self.n = n
        self.structure = structure

    def __iter__(self) -> Iterator:
        wid, nw = self.shard()
        for i in range(wid, self.n, nw):
            yield make_sample(self.structure, i)


class SizedShardedIterDS(ShardedIterDS):
    def __len__(self) -> int:
        return self.n


class DuplicatingIterDS(IterableDataset):
    """Does not shard: every worker yields every element, as torch documents."""

    def __init__(self, n: int = 23, structure: str = "tensor") -> None:
        self.n = n
        self.structure = structure

    def __iter__(self) -> Iterator:
        for i in range(self.n):
            yield make_sample(self.structure, i)


class SizedDuplicatingIterDS(DuplicatingIterDS):
    def __len__(self) -> int:
        return self.n


class LyingLenIterDS(DuplicatingIterDS):
    """Reports fewer elements than it yields (torch warns once len(loader) was asked)."""

    def __init__(self, n: int = 23, structure: str = "tensor", reported: int = 5) -> None:
        super().__init__(n, structure)
        self.reported = reported

    def __len__(self) -> int:
        return self.reported


class WorkerProbeDS(Dataset):
    """Each sample tells where it was made: (index, pid, worker id, num_workers, seed, is_self)."""

    def __init__(self, n: int = 12) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple:
        return (int(i), *probe(self))


class WorkerProbeIterDS(IterableDataset, _WorkerShard):
    def __init__(self, n: int = 12) -> None:
        self.n = n

    def __iter__(self) -> Iterator:
        wid, nw = self.shard()
        for i in range(wid, self.n, nw):
            yield (i, *probe(self))


def probe(dataset: object) -> tuple:
    info = get_worker_info()
    if info is None:
        return (os.getpid(), -1, 0, -1, False)
    return (os.getpid(), info.id, info.num_workers, info.seed, info.dataset is dataset)


class ContextProbeDS(Dataset):
    """Samples carry (index, pid, ppid, cmdline) so a test can tell how the worker started."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> tuple:
        with open("/proc/self/cmdline", "rb") as fh:
            cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        return (int(i), os.getpid(), os.getppid(), cmdline)


class GatedDS(Dataset):
    """Index ``block_index`` (every index if None) waits for ``release`` after setting ``started``.

    The events come from ``multiprocessing`` so that they cross into workers.
    """

    def __init__(self, n: int, release: Any, started: Any, block_index: int | None = 0) -> None:
        self.n = n
        self.release = release
        self.started = started
        self.block_index = block_index

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if self.block_index is None or i == self.block_index:
            self.started.set()
            self.release.wait(BLOCK_TIMEOUT_S)
        return int(i)


# --------------------------------------------------------------------------------------------
# Samplers and collate functions
# --------------------------------------------------------------------------------------------


class VariableBatchSampler(Sampler[list[int]]):
    """Batches of sizes 1, 2, 3, 1, 2, 3, ... over ``range(n)``, in reverse order."""

    def __init__(self, n: int) -> None:
        self.n = n

    def _batches(self) -> list[list[int]]:
        order = list(range(self.n))[::-1]
        out, size = [], 1
        while order:
            out.append(order[:size])
            order = order[size:]
            size = size % 3 + 1
        return out

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


def summarizing_collate(batch: list) -> dict:
    """A custom collate_fn that returns no tensors at all."""
    return {"n": len(batch), "reprs": tuple(repr(b) for b in batch), "first": batch[0]}


def identity_collate(batch: Any) -> Any:
    return batch


# --------------------------------------------------------------------------------------------
# Worker init functions
# --------------------------------------------------------------------------------------------


def _append_line(path: str, line: str) -> None:
    # One O_APPEND write per line: atomic for lines this short, across processes.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def record_worker_init(path: str, worker_id: int) -> None:
    """worker_init_fn: appends ``{"worker_id", "pid", "seed"}`` as a JSON line to ``path``."""
    info = get_worker_info()
    rec = {"worker_id": worker_id, "pid": os.getpid(), "seed": info.seed if info else None}
    _append_line(path, json.dumps(rec))


def record_worker_rng(path: str, worker_id: int) -> None:
    """worker_init_fn: appends the first draw of every global RNG a worker can reach."""
    info = get_worker_info()
    rec = {
        "worker_id": worker_id,
        "seed": info.seed if info else None,
        "random": random.random(),
        "numpy": float(np.random.rand()),
        "torch": float(torch.rand(1).item()),
    }
    _append_line(path, json.dumps(rec))


def read_records(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def failing_worker_init(worker_id: int) -> None:
    raise ValueError(f"bad init in worker_init_fn for worker {worker_id}")


# --------------------------------------------------------------------------------------------
# Exceptions and a dataset that raises them
# --------------------------------------------------------------------------------------------


class CodedError(Exception):
    """Two constructor arguments, passed on to Exception (pickles by default)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code
        self.detail = detail


class MessageOnlyCodedError(Exception):
    """Two constructor arguments but one message in ``args``: plain pickling cannot rebuild it."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class UnpicklableError(Exception):
    """Holds a lock, so it cannot be pickled out of a worker."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def _raise_coded_error_in_getitem(i: int) -> None:
    raise CodedError("E_BAD_SAMPLE", "the sample is corrupt")


def _raise_message_only_error_in_getitem(i: int) -> None:
    raise MessageOnlyCodedError("E_BAD_SAMPLE", "the sample is corrupt")


def _raise_unpicklable_error_in_getitem(i: int) -> None:
    raise UnpicklableError("cannot travel")


def _raise_key_error_in_getitem(i: int) -> None:
    raise KeyError("missing-key")


def _raise_value_error_in_getitem(i: int) -> None:
    raise ValueError("bad value in sample")


def _raise_stop_iteration_in_getitem(i: int) -> None:
    raise StopIteration


RAISERS = {
    "coded": _raise_coded_error_in_getitem,
    "message_only": _raise_message_only_error_in_getitem,
    "unpicklable": _raise_unpicklable_error_in_getitem,
    "key": _raise_key_error_in_getitem,
    "value": _raise_value_error_in_getitem,
    "stop": _raise_stop_iteration_in_getitem,
}


class RaisingDS(Dataset):
    """Raises ``RAISERS[kind]`` at ``fail_index`` while ``flag_path`` exists (always if None).

    Before raising it appends ``{"worker_id", "index"}`` to ``record_path`` (if given) so a test
    knows which worker failed.
    """

    def __init__(
        self,
        kind: str,
        n: int = 23,
        fail_index: int = 13,
        flag_path: str | None = None,
        record_path: str | None = None,
    ) -> None:
        self.kind = kind
        self.n = n
        self.fail_index = fail_index
        self.flag_path = flag_path
        self.record_path = record_path

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        armed = self.flag_path is None or os.path.exists(self.flag_path)
        if i == self.fail_index and armed:
            if self.record_path is not None:
                info = get_worker_info()
                rec = {"worker_id": info.id if info else None, "index": int(i)}
                _append_line(self.record_path, json.dumps(rec))
            RAISERS[self.kind](i)
        return int(i)


def _raise_in_collate(batch: list) -> None:
    raise ValueError(f"collate cannot handle {batch!r}")


class FailingCollate:
    """collate_fn that raises ValueError for a batch containing ``fail_value``."""

    def __init__(self, fail_value: int = 13) -> None:
        self.fail_value = fail_value

    def __call__(self, batch: list) -> Any:
        if self.fail_value in batch:
            _raise_in_collate(batch)
        return torch.tensor(batch)


# --------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------


def _is_namedtuple(x: object) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def assert_batches_equal(expected: Any, actual: Any, path: str = "batches") -> None:
    """Recursive strict equality: types, container types, namedtuple types, tensors, arrays.

    Tensors must match in type, dtype, shape, layout and values; numpy arrays in dtype, shape
    and values; mappings in type, key order and values; sequences in type and length.
    """
    assert type(actual) is type(expected), (
        f"{path}: expected type {type(expected).__qualname__}, got {type(actual).__qualname__}"
        f" ({actual!r:.200})"
    )
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        assert actual.layout == expected.layout, f"{path}: layout {actual.layout}"
        assert actual.device == expected.device, f"{path}: device {actual.device}"
        assert torch.equal(actual, expected), f"{path}: values\n{actual}\n!=\n{expected}"
    elif isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        assert np.array_equal(actual, expected), f"{path}: values\n{actual}\n!=\n{expected}"
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for key in expected:
            assert_batches_equal(expected[key], actual[key], f"{path}[{key!r}]")
    elif _is_namedtuple(expected):
        for field in expected._fields:
            assert_batches_equal(
                getattr(expected, field), getattr(actual, field), f"{path}.{field}"
            )
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for k, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_batches_equal(e, a, f"{path}[{k}]")
    else:
        assert actual == expected, f"{path}: {actual!r:.200} != {expected!r:.200}"


def drop_tracebacks(exc: BaseException | None, _seen: set[int] | None = None) -> None:
    """Clear the tracebacks of ``exc`` and its chain.

    An exception re-raised from a loader's iterator holds, through its traceback, the frames
    that hold the iterator: a reference cycle that keeps the worker processes alive until the
    next ``gc.collect()``, and torch's DataLoader then needs ~5 s per worker to shut down (its
    queues are finalized in the same collection). Tests that only record an exception's type
    break the cycle with this, so the iterator is shut down right away.
    """
    seen = set() if _seen is None else _seen
    if exc is None or id(exc) in seen:
        return
    seen.add(id(exc))
    exc.__traceback__ = None
    drop_tracebacks(exc.__cause__, seen)
    drop_tracebacks(exc.__context__, seen)


class EpochPlan(Sampler[list[int]]):
    """A batch sampler yielding the batches set by ``plan`` (it runs in the main process only)."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def plan(self, batches: list[list[int]]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(list(self.batches))

    def __len__(self) -> int:
        return len(self.batches)


class BigArrayDS(Dataset):
    """A dataset holding a large numpy array, a torch tensor and a shared list, for spawned
    workers (NOTE [ Pickle once ]). ``ds[i]`` = (worker pid, array[0, 0], array[i].sum(),
    whether the array views a shared mapping, tensor[i], UTF-8 length of name i)."""

    def __init__(self, mib: int = 32) -> None:
        from stoker.sharing import SharedStrList

        rows = mib * 2**20 // (64 * 8)
        self.array = np.arange(rows * 64, dtype=np.float64).reshape(rows, 64)
        self.tensor = torch.arange(64, dtype=torch.int64)
        self.names = SharedStrList([f"name_{i}" for i in range(64)])

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple:
        import mmap

        base = self.array.base
        while isinstance(base, np.ndarray):
            base = base.base
        viewed = isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)
        row = self.array[i * 37 % len(self.array)]
        return (
            os.getpid(),
            float(self.array[0, 0]),
            float(row.sum()),
            int(viewed),
            int(self.tensor[i]),
            len(self.names[i]),
        )


class PicklingCounted(Dataset):
    """Notes, in the process that pickles it, the thread of each ``__getstate__``;
    ``ds[i]`` = (i, whether its 1 MiB array owns its data in the process that reads it)."""

    pickled: list[str] = []

    def __init__(self) -> None:
        self.array = np.zeros(2**17)

    def __getstate__(self) -> dict:
        import threading

        PicklingCounted.pickled.append(threading.current_thread().name)
        return self.__dict__

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> tuple:
        return i, int(self.array.flags.owndata)


def touch_and_mark_array(worker_id: int) -> None:
    """worker_init_fn: read the whole array (its pages shared by every worker), then write
    one element, which must stay this worker's own."""
    ds = torch.utils.data.get_worker_info().dataset
    float(ds.array.sum())
    ds.array[0, 0] = 1000.0 + worker_id


class UnpicklableDS(MapDS):
    def __init__(self) -> None:
        super().__init__()
        self.fn = lambda x: x  # a lambda does not pickle: spawn cannot start a worker with it


class BadStateDS(MapDS):
    """Pickles, but cannot be unpickled in a worker."""

    def __setstate__(self, state: dict) -> None:
        raise RuntimeError("this dataset cannot be restored in a worker")


class FlagsDS(Dataset):
    """``ds[i]`` = (whether the writable array is writable, whether the read-only one is)."""

    def __init__(self) -> None:
        self.writable = np.zeros(1 << 16)
        self.frozen = np.ones(1 << 16)
        self.frozen.flags.writeable = False

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> tuple:
        return int(self.writable.flags.writeable), int(self.frozen.flags.writeable)


class UnevenRandomDS(Dataset):
    """Draws from ``random`` per sample, and every 7th sample costs ~3 ms of CPU, so workers
    finish their batches at uneven times: which worker loads a batch shows in its draws."""

    def __init__(self, n: int = 160) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.thread_time() + (0.003 if i % 7 == 0 else 0.0003)
        while time.thread_time() < end:  # CPU work, not a wait
            pass
        return torch.tensor([i, random.randint(0, 10**9)])


class IndexableRandomDS(Dataset):
    """Cheap, indexable by a tensor of indices (so stoker probes a batched call), and draws
    from torch's and numpy's global RNGs per sample."""

    def __init__(self, n: int = 160) -> None:
        self.x = torch.arange(float(n))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: Any) -> torch.Tensor:
        return self.x[i] * torch.rand(()) + float(np.random.rand())


class PreparingDataset(Dataset):
    """Writes, per worker process, which batches ``stoker_prepare_batch`` was shown and which
    samples were read, before each read (a line per event in ``log_dir/<pid>``)."""

    def __init__(self, n: int, log_dir: str) -> None:
        self.n, self.log_dir = n, log_dir

    def __len__(self) -> int:
        return self.n

    def _log(self, event: list[Any]) -> None:
        with open(os.path.join(self.log_dir, str(os.getpid())), "a") as f:
            f.write(json.dumps(event) + "\n")

    def stoker_prepare_batch(self, indices: list[int]) -> None:
        self._log(["prepare", list(indices)])

    def __getitem__(self, i: int) -> int:
        self._log(["get", i])
        return i
