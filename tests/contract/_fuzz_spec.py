"""The plain, printable description of one differential-fuzz case.

A ``Case`` is what hypothesis generates and what a failure prints: frozen dataclasses of ints,
strings and tuples only, so that the printed ``Case(...)`` pastes into a script as it is (see
``_fuzz_record.compare``). ``_fuzz_cases`` turns a spec into the user-style objects it describes
(datasets, samplers, collates, worker_init_fns); ``_fuzz_record`` runs them through a loader.

A sample is a tree: ``Node`` containers (dict, list, tuple, namedtuple and subclasses carrying
attributes) around ``Leaf`` values (numpy arrays and scalars, tensors, Python scalars, strings,
objects default_collate refuses), ``Ref`` leaves (the same object as, or a view of, an earlier
leaf of the same sample: aliasing) and ``Obs`` leaves (what the user's code observed while
building the sample: worker info, RNG draws, the thread and process, attributes set on the
dataset by the main process or by ``worker_init_fn``, and the process it runs in: signals,
names, limits, environment, what a program it starts inherits; ``_fuzz_env``).

A ``Case`` also says under which warning filters it runs (``Case.warn``, one of
``_fuzz_env.WARN_MODES``): what the loader says through ``warnings`` is compared as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# --------------------------------------------------------------------------------------------
# Samples
# --------------------------------------------------------------------------------------------

LEAF_KINDS = (
    "np",  # numpy array of ``dtype`` and ``shape``
    "npscalar",  # numpy scalar of ``dtype``
    "torch",  # tensor of ``dtype`` and ``shape``
    "tscalar",  # 0-d tensor of ``dtype``
    "int",
    "float",
    "bool",
    "str",
    "bytes",
    "none",  # default_collate refuses it (TypeError)
    "obj",  # a plain user object (default_collate refuses it; default_convert passes it)
    "np_str",  # numpy array of strings (default_collate refuses it)
)

# What a sample can report about where and how it was built. The worker-dependent ones change
# with the worker that built the sample; they are left out where torch itself does not fix the
# worker (in_order=False with two or more workers on a map-style dataset).
# The process's own (``_fuzz_env``): ``sig``, ``names``, ``rt``, ``proc``, ``info``, ``gen`` and
# ``child``; ``child`` starts a process per sample, so it is drawn for about one case in
# twenty, not with the others.
# ``drawn`` (how far a program's sampler has run in the loop's process) and ``lgen`` (a draw
# from the loader's own generator) read what a worker's copy of the main process holds: torch
# forks every worker before the sampler's first draw.
OBS_WORKER_DEPENDENT = ("wid", "seed", "iseed", "py", "np", "th", "pid", "init", "calls",
                        "proc", "info", "gen", "lgen")
OBS_STABLE = ("nw", "ds_is_self", "main_thread", "tag", "prog", "iter", "sig", "names", "rt",
              "drawn")
OBS_NAMES = OBS_WORKER_DEPENDENT + OBS_STABLE
OBS_RARE = ("child",)


@dataclass(frozen=True)
class Leaf:
    kind: str
    dtype: str = ""
    shape: tuple[int, ...] = ()
    # "fresh": built per call; "view"/"copy": a row of a table the dataset holds (arrays only)
    source: str = "fresh"
    alt: Leaf | None = None  # used for odd indices: mixed types/dtypes/shapes across samples


@dataclass(frozen=True)
class Ref:
    target: int  # number of an earlier leaf of the same sample (depth-first order)
    view: bool  # a view of it (arrays); else the very same object


@dataclass(frozen=True)
class Obs:
    names: tuple[str, ...]


@dataclass(frozen=True)
class Node:
    # "dict" | "tagged_dict" (dict subclass with an attribute) | "list" | "tagged_list" |
    # "tuple" | "namedtuple" (Pair/Triple by arity)
    kind: str
    children: tuple[Any, ...]
    keys: tuple[Any, ...] = ()


Tree = Leaf | Ref | Obs | Node


# --------------------------------------------------------------------------------------------
# Datasets, samplers, collates, worker_init_fns
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """An exception the user's code raises at a given index / call number."""

    at: int
    exc: str  # a name in _fuzz_cases.EXCEPTIONS
    worker: int | None = None  # collate_fn only: raise in this worker alone


@dataclass(frozen=True)
class TensorSpec:
    """A tensor of torch's dataset classes (``_fuzz_torch_ds``): ``rows`` rows of ``shape``."""

    dtype: str
    shape: tuple[int, ...] = ()  # a row's shape: () gives 0-d samples
    # "plain" | "noncontig" (every other row of a larger tensor) | "offset" (contiguous, at a
    # storage offset) | "grad" (requires_grad: torch's collate in a worker refuses it) |
    # "param" (an nn.Parameter, a Tensor subclass) | "shared" (``share_memory_()``) |
    # "mapped" (in an anonymous shared ``mmap``)
    layout: str = "plain"


@dataclass(frozen=True)
class TorchDS:
    """One of torch's own dataset classes, as built by ``_fuzz_torch_ds.build_torch_ds``."""

    # "tensors" (TensorDataset) | "tensor" (a bare tensor used as a dataset) | "stack"
    # (StackDataset of a tuple) | "stack_dict" | "subset" | "concat" (ConcatDataset)
    kind: str
    n: int  # its length
    children: tuple[Any, ...] = ()  # TensorSpec for "tensors"/"tensor", else TorchDS
    keys: tuple[str, ...] = ()  # "stack_dict"; "subset": the indices' type (list, tuple, tensor)
    indices: tuple[int, ...] = ()  # "subset": into its child (negative, out of range)


@dataclass(frozen=True)
class FormatDS:
    """One of stoker's own formats, as built by ``_fuzz_formats.build_format_ds``: tar shards
    of ``n`` samples read by ``TarShards``."""

    n: int
    shards: int = 1  # the samples split over this many .tar files
    exts: tuple[str, ...] = ("cls",)  # each sample's members (``cls`` holds its number)
    # None | "label" (int of cls) | "tensor" (the bytes as a uint8 tensor + the label) |
    # "vision" (a JPEG through stoker.vision's fused Compose + the label) | "fault" (raises
    # ValueError at sample ``fault_at``)
    transform: str | None = None
    fault_at: int = -1


@dataclass(frozen=True)
class DatasetSpec:
    style: str  # "map" | "map_getitems" | "iter" | "torch" (torch's classes: ``torch_ds``)
    n: int
    tree: Tree
    fault: Fault | None = None
    # iterable only: how workers split the items; whether/what __len__ says
    split: str = "shard"  # "shard" | "dup" | "uneven" | "first"
    length: str = "none"  # "none" | "true" | "lie"
    gen: bool = False  # holds np.random.default_rng(0) (every worker copies it)
    torch_ds: TorchDS | None = None  # style "torch": the dataset (``tree`` is unused)
    format_ds: FormatDS | None = None  # style "formats": stoker's own (``tree`` is unused)


@dataclass(frozen=True)
class SamplerSpec:
    # "seq" | "rev" | "list" | "random" | "random_gen" | "random_repl" | "subset_random" |
    # "weighted" | "stateful" | "progress" | "nolen" | "raising"
    kind: str
    seed: int = 0


@dataclass(frozen=True)
class BatchSamplerSpec:
    # "torch" (BatchSampler over ``sampler``) | "variable" | "stateful" | "progress"
    kind: str
    sampler: SamplerSpec | None = None
    batch_size: int = 2
    drop_last: bool = False


@dataclass(frozen=True)
class CollateSpec:
    base: str  # "default" | "identity" | "numpy" | "first" | "convert"
    obs: tuple[str, ...] = ()  # see _fuzz_cases.COLLATE_OBS
    alias: bool = False  # also return the first array leaf again, and a view of it
    fault: Fault | None = None  # raise at this call number (per copy of the collate)
    tag: str = "c0"


@dataclass(frozen=True)
class WorkerInitSpec:
    draws: bool = True  # record RNG draws and worker info on the dataset copy
    reseed_np: bool = False  # the common idiom: np.random.seed(get_worker_info().seed % 2**32)
    fault_worker: int | None = None  # raise in this worker
    tag: str = "w0"


@dataclass(frozen=True)
class Op:
    """A reassignment between epochs: ``loader.<attr> = <value>`` (built from a spec)."""

    # "worker_init_fn" | "collate_fn" | "generator" | "num_workers" | "batch_size" ...; or
    # "write_tables": torch's classes' tensors written in place (``_fuzz_torch_ds``);
    # "patch_torch": torch's code patched by the program, ``value`` names it (``_fuzz_patches``);
    # "torch_mode": the epoch iterates inside a counting torch mode of kind ``value``
    # (``tests/_counting_modes.py``)
    attr: str
    value: Any = None


@dataclass(frozen=True)
class EpochSpec:
    ops: tuple[Op, ...] = ()
    stop_after: int | None = None  # break after this many batches
    continue_on_error: bool = False  # call next() again after an exception (up to 2)
    hold: bool = False  # keep every batch until the epoch ends; check none changed


@dataclass(frozen=True)
class Case:
    dataset: DatasetSpec
    # keyword arguments passed explicitly (in this order); specs are built into objects
    args: tuple[tuple[str, Any], ...]
    epochs: tuple[EpochSpec, ...]
    len_first: bool = False
    main_seed: int = 0
    warn: str = "record"  # the warning filters it runs under: a name in _fuzz_env.WARN_MODES
    started: str = "terminal"  # "background": SIGINT/SIGQUIT/SIGHUP ignored (_fuzz_env.STARTED)

    def arg(self, name: str, default: Any = None) -> Any:
        return dict(self.args).get(name, default)

    @property
    def order_free(self) -> bool:
        """True where torch's own batch order depends on timing (in_order=False, 2+ workers)."""
        return self.arg("in_order", True) is False and (self.arg("num_workers", 0) or 0) >= 2
