"""User-style samples and datasets built from ``_fuzz_spec`` (samplers, collates and
worker_init_fns are in ``_fuzz_callables``).

Everything is module-level and picklable (workers may be forked, spawned or forkserved; this
directory is on the sys.path they inherit). The code is written the way users write it: it
reads ``get_worker_info()``, draws from ``random``/numpy/torch, logs its calls into a list,
keeps counters and tags, raises odd exceptions, looks at the process it runs in
(``_fuzz_env``: signals, names, limits, environment; the main process's environment at build
time is the dataset's ``parent_env``). In the main process (``num_workers=0``) the
log is the ``Log`` the test loop writes to as well, so the order of the user's side effects
against the loop's progress is part of the record.
"""

from __future__ import annotations

import os
import random
import threading
from collections import namedtuple
from typing import Any

import numpy as np
import torch
from _fuzz_env import OBS_ENV, observe, stdio_targets
from _fuzz_spec import DatasetSpec, Leaf, Node, Ref, Tree
from torch.utils.data import Dataset, IterableDataset, get_worker_info

Pair = namedtuple("Pair", ["a", "b"])
Triple = namedtuple("Triple", ["x", "y", "z"])
NAMEDTUPLES = {2: Pair, 3: Triple}


class TaggedDict(dict):
    """A dict subclass with an attribute (default_collate copies it with copy.copy)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.origin = "sample"


class TaggedList(list):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.origin = "sample"


class Thing:
    """A plain user object: default_collate refuses it, default_convert passes it through."""

    def __init__(self, value: int) -> None:
        self.value = value


# --------------------------------------------------------------------------------------------
# Exceptions with odd constructors and attributes
# --------------------------------------------------------------------------------------------


class CodedError(Exception):
    """Takes a message and an optional keyword attribute (torch rebuilds it from the message)."""

    def __init__(self, msg: str, code: int = 0) -> None:
        super().__init__(msg)
        self.code = code


class TwoArgError(Exception):
    """Cannot be built from one string: torch raises RuntimeError instead."""

    def __init__(self, where: str, code: int) -> None:
        super().__init__(where, code)
        self.where, self.code = where, code


class MessageError(Exception):
    """Has a ``message`` class attribute: torch rebuilds it with ``message=``."""

    message = "message attribute"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class LockedError(Exception):
    """Holds an attribute that does not pickle."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.handle = threading.Lock()


def make_exception(name: str, where: str) -> BaseException:
    msg = f"fuzz fault at {where}"
    if name == "coded":
        return CodedError(msg, code=42)
    if name == "two_arg":
        return TwoArgError(msg, 42)
    if name == "message":
        return MessageError(msg)
    if name == "locked":
        return LockedError(msg)
    return EXCEPTIONS[name](msg)


EXCEPTIONS: dict[str, type[BaseException]] = {
    "value": ValueError,
    "key": KeyError,
    "index": IndexError,
    "type": TypeError,
    "runtime": RuntimeError,
    "stop": StopIteration,
    "coded": CodedError,
    "two_arg": TwoArgError,
    "message": MessageError,
    "locked": LockedError,
}


# --------------------------------------------------------------------------------------------
# The log the main process shares with the test loop
# --------------------------------------------------------------------------------------------


class Log(list):
    """Events in the order the user's code saw them; ``add`` notes whether on the main thread."""

    def add(self, *event: Any) -> None:
        on_main = threading.current_thread() is threading.main_thread()
        self.append((*event, "main" if on_main else "thread"))


# --------------------------------------------------------------------------------------------
# Samples
# --------------------------------------------------------------------------------------------


def _np_dtype(name: str) -> np.dtype:
    return np.dtype(name)


def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _np_array(leaf: Leaf, base: int) -> np.ndarray:
    numel = int(np.prod(leaf.shape)) if leaf.shape else 1
    raw = np.arange(numel, dtype=np.int64) + base
    if leaf.dtype == "bool":
        raw = raw % 2
    elif leaf.dtype in ("uint8", "int8"):
        raw = raw % 100
    out = raw.astype(_np_dtype(leaf.dtype)).reshape(leaf.shape)
    if leaf.dtype.startswith("float"):
        out += np.asarray(0.25, dtype=out.dtype)  # in place: a 0-d array stays an array
    if leaf.dtype.startswith("complex"):
        out += np.asarray(0.5j, dtype=out.dtype)
    return out


def _tensor(leaf: Leaf, base: int) -> torch.Tensor:
    numel = int(np.prod(leaf.shape)) if leaf.shape else 1
    raw = torch.arange(numel, dtype=torch.int64) + base
    if leaf.dtype == "bool":
        raw = raw % 2
    elif leaf.dtype in ("uint8", "int8"):
        raw = raw % 100
    out = raw.to(_torch_dtype(leaf.dtype)).reshape(leaf.shape)
    if out.is_floating_point():
        out = out + 0.25
    if out.is_complex():
        out = out + 0.5j
    return out


def make_leaf(leaf: Leaf, index: int, number: int) -> Any:
    """The value of leaf ``number`` of sample ``index`` (fresh leaves; alt for odd indices)."""
    if leaf.alt is not None and index % 2 == 1:
        leaf = leaf.alt
    base = index * 10 + number
    kind = leaf.kind
    if kind == "np":
        return _np_array(leaf, base)
    if kind == "npscalar":
        return _np_array(Leaf("np", leaf.dtype, ()), base)[()]
    if kind == "torch":
        return _tensor(leaf, base)
    if kind == "tscalar":
        return _tensor(Leaf("torch", leaf.dtype, ()), base)
    if kind == "int":
        return base
    if kind == "float":
        return base + 0.5
    if kind == "bool":
        return index % 2 == 0
    if kind == "str":
        return f"s{base}"
    if kind == "bytes":
        return b"b%d" % base
    if kind == "none":
        return None
    if kind == "obj":
        return Thing(base)
    if kind == "np_str":
        return np.array([f"s{base}", "x"])
    raise AssertionError(f"unknown leaf kind {kind!r}")


def view_of(value: Any) -> Any:
    """A view of an array leaf (all but its first element); anything else as it is."""
    if isinstance(value, torch.Tensor) and value.numel() > 1:
        return value.reshape(-1)[1:]
    if isinstance(value, np.ndarray) and value.size > 1:
        return value.reshape(-1)[1:]
    return value


def iter_leaves(tree: Tree) -> list[Tree]:
    """The leaves of ``tree`` (Leaf, Ref, Obs) in depth-first order."""
    if isinstance(tree, Node):
        return [leaf for child in tree.children for leaf in iter_leaves(child)]
    return [tree]


def build_tables(tree: Tree, n: int) -> dict[int, Any]:
    """The arrays a dataset holds for its ``view``/``copy`` leaves: row i is sample i's value."""
    tables: dict[int, Any] = {}
    for number, leaf in enumerate(iter_leaves(tree)):
        if isinstance(leaf, Leaf) and leaf.source != "fresh":
            rows = [make_leaf(Leaf(leaf.kind, leaf.dtype, leaf.shape), i, number)
                    for i in range(max(n, 1))]
            if leaf.kind == "np":
                tables[number] = np.stack(rows)
            else:
                tables[number] = torch.stack(rows)
    return tables


# --------------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------------


class _SampleMaker:
    """What every fuzz dataset shares: building samples and the observations in them."""

    def _setup(self, spec: DatasetSpec, log: Log, progress: dict[str, int]) -> None:
        self.spec = spec
        self.log = log
        self.progress = progress
        self.tables = build_tables(spec.tree, spec.n)
        self.tag = "init"
        self.init_obs = "none"
        self.iter_obs = "none"
        self.calls = 0
        self.parent_env = dict(os.environ)  # what the rt observation compares with
        self.parent_stdio = stdio_targets()
        self.gen = np.random.default_rng(0) if spec.gen else None

    def _observe(self, name: str) -> Any:
        if name in OBS_ENV:
            return observe(name, self)
        info = get_worker_info()
        if name == "wid":
            return -1 if info is None else info.id
        if name == "nw":
            return -1 if info is None else info.num_workers
        if name == "seed":
            return "none" if info is None else str(info.seed)
        if name == "ds_is_self":
            return info is None or info.dataset is self
        if name == "iseed":
            return str(torch.initial_seed())
        if name == "py":
            return random.random()
        if name == "np":
            return int(np.random.randint(0, 1 << 30))
        if name == "th":
            return torch.randint(0, 1 << 30, ())
        if name == "main_thread":
            return threading.current_thread() is threading.main_thread()
        if name == "pid":
            return f"pid:{os.getpid()}"
        if name == "init":
            return self.init_obs
        if name == "tag":
            return self.tag
        if name == "prog":
            return self.progress["received"]
        if name == "drawn":  # indices a program's sampler yielded in the loop's process so far
            return self.progress.get("drawn", 0)
        if name == "lgen":  # a draw from the generator the loader shuffles with, if any
            generator = self.progress.get("generator")
            return "none" if generator is None else int(
                torch.randint(0, 1 << 30, (), generator=generator))
        if name == "calls":
            return self.calls
        if name == "iter":
            return self.iter_obs
        raise AssertionError(f"unknown observation {name!r}")

    def _build(self, tree: Tree, index: int, made: list[Any]) -> Any:
        if isinstance(tree, Node):
            children = [self._build(child, index, made) for child in tree.children]
            if tree.kind == "dict":
                return dict(zip(tree.keys, children, strict=True))
            if tree.kind == "tagged_dict":
                return TaggedDict(zip(tree.keys, children, strict=True))
            if tree.kind == "list":
                return children
            if tree.kind == "tagged_list":
                return TaggedList(children)
            if tree.kind == "tuple":
                return tuple(children)
            return NAMEDTUPLES[len(children)](*children)
        number = len(made)
        if isinstance(tree, Leaf):
            if tree.source == "fresh":
                value = make_leaf(tree, index, number)
            else:
                row = self.tables[number][index, ...]  # a view, also of a 0-d row
                value = row if tree.source == "view" else row.copy() if isinstance(
                    row, np.ndarray) else row.clone()
        elif isinstance(tree, Ref):
            target = made[tree.target] if tree.target < number else None
            value = view_of(target) if tree.view else target
        else:
            value = {name: self._observe(name) for name in tree.names}
        made.append(value)
        return value

    def sample(self, index: int) -> Any:
        self.calls += 1
        fault = self.spec.fault
        if fault is not None and fault.at == index:
            raise make_exception(fault.exc, f"sample {index}")
        return self._build(self.spec.tree, index, [])


class FuzzMapDataset(_SampleMaker, Dataset):
    def __init__(self, spec: DatasetSpec, log: Log, progress: dict[str, int]) -> None:
        self._setup(spec, log, progress)

    def __len__(self) -> int:
        self.log.add("len(ds)")
        return self.spec.n

    def __getitem__(self, index: int) -> Any:
        self.log.add("getitem", index)
        return self.sample(index)


class FuzzBatchedDataset(FuzzMapDataset):
    """Map-style with ``__getitems__`` (torch's batched fetch)."""

    def __getitems__(self, indices: list[int]) -> list[Any]:
        self.log.add("getitems", tuple(indices))
        return [self.sample(i) for i in indices]


class FuzzIterDataset(_SampleMaker, IterableDataset):
    def __init__(self, spec: DatasetSpec, log: Log, progress: dict[str, int]) -> None:
        self._setup(spec, log, progress)

    def _indices(self) -> range | list[int]:
        info = get_worker_info()
        n, split = self.spec.n, self.spec.split
        if info is None or split == "dup":
            return range(n)
        if split == "shard":
            return range(info.id, n, info.num_workers)
        if split == "first":
            return range(n) if info.id == 0 else []
        # uneven: worker k yields the k-th of a split into 1, 2, 3, ... parts
        step = max(1, n // (info.num_workers + 1))
        return range(info.id * step, min(n, (info.id + 1) * step + info.id))

    def __iter__(self) -> Any:
        self.log.add("iter(ds)")
        self.iter_obs = f"{random.random()!r}/{np.random.randint(1 << 30)}/" + (
            f"{int(torch.randint(1 << 30, ()))}"
        )
        for index in self._indices():
            yield self.sample(index)



class SizedFuzzIterDataset(FuzzIterDataset):
    """An IterableDataset with ``__len__`` (``lie``: two fewer than it yields)."""

    def __len__(self) -> int:
        self.log.add("len(ds)")
        return self.spec.n if self.spec.length == "true" else max(0, self.spec.n - 2)


def build_dataset(spec: DatasetSpec, log: Log, progress: dict[str, int]) -> Any:
    if spec.style == "torch":  # torch's own classes (the module imports this one)
        from _fuzz_torch_ds import build_torch_ds

        assert spec.torch_ds is not None
        return build_torch_ds(spec.torch_ds)
    if spec.style == "formats":  # stoker's own formats (the module imports this one)
        from _fuzz_formats import build_format_ds

        assert spec.format_ds is not None
        return build_format_ds(spec.format_ds)
    if spec.style == "iter":
        cls = FuzzIterDataset if spec.length == "none" else SizedFuzzIterDataset
        return cls(spec, log, progress)
    cls = FuzzBatchedDataset if spec.style == "map_getitems" else FuzzMapDataset
    return cls(spec, log, progress)
