"""Hypothesis strategies that generate ``Case``s: user-style datasets, samplers, collates and
loader arguments, mostly valid under torch, sometimes not (torch's construction errors are
part of the contract too), and the warning filters the case runs under (``record`` for most,
``error``, ``ignore_torch`` or ``default`` for about one case in three).

Where torch's own result depends on timing, the case leaves out what would make the
comparison flaky under torch itself (see ``Plan``): with ``in_order=False`` and two or more
workers, observations that depend on which worker built a sample (map-style only: an
iterable's workers each build their own stream), errors, and stopping an epoch early (the
record sorts such epochs' batches and masks the process ids in them, ``Case.order_free``);
with an iterable dataset and two or more persistent workers, errors and stopping the first
epoch early.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from _fuzz_callables import COLLATE_OBS
from _fuzz_cases import EXCEPTIONS
from _fuzz_env import WARN_MODES
from _fuzz_formats import format_datasets
from _fuzz_known import masked
from _fuzz_patches import PATCHES
from _fuzz_spec import (
    OBS_NAMES,
    OBS_RARE,
    OBS_STABLE,
    BatchSamplerSpec,
    Case,
    CollateSpec,
    DatasetSpec,
    EpochSpec,
    Fault,
    Leaf,
    Node,
    Obs,
    Op,
    Ref,
    SamplerSpec,
    Tree,
    WorkerInitSpec,
)
from _fuzz_torch_ds import torch_datasets
from hypothesis import strategies as st

from _counting_modes import MODES

NP_DTYPES = ("float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8",
             "bool", "complex64")
TORCH_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                "uint8", "bool", "complex64")
COLLATE_OBS_STABLE = ("c_main", "c_n")
SAMPLER_KINDS = ("seq", "rev", "list", "random", "random_gen", "random_repl", "subset_random",
                 "weighted", "stateful", "progress", "nolen", "raising")
TORCH_DS_SAMPLER_KINDS = ("neg", "np")
WORKER_TIMEOUT_S = (30.0, 45)  # every blocking next() with workers ends (timeout=0 would not)

shapes = st.lists(st.sampled_from((0, 1, 2, 3)), max_size=2).map(tuple)


def rarely(draw: Any, one_in: int) -> bool:
    """True about once in ``one_in + 1`` draws. (Not ``integers(0, k) == 0``: hypothesis
    draws the simplest value, 0, far more often than 1 in k+1.)"""
    return draw(st.integers(0, one_in)) == one_in


@dataclass(frozen=True)
class Plan:
    """What the case as a whole allows, decided before its parts are drawn."""

    style: str
    num_workers: int
    in_order: bool | None
    num_workers_op: int | None  # loader.num_workers reassigned before the second epoch
    persistent: bool | None  # persistent_workers passed (None: left out)
    how: str  # "plain" | "sampler" | "batch_sampler"
    batch_size: int | None | str  # "omit": not passed

    @property
    def unbatched(self) -> bool:
        """batch_size=None: the collate_fn gets one sample at a time."""
        return self.batch_size is None

    @property
    def workers_ever(self) -> bool:
        return self.num_workers > 0 or bool(self.num_workers_op)

    @property
    def order_free(self) -> bool:
        """torch's own order depends on timing: no faults, no early stops (see module doc)."""
        return self.in_order is False and self.num_workers >= 2

    @property
    def stable_only(self) -> bool:
        """Only observations that do not depend on the worker that built the sample."""
        return self.order_free and self.style != "iter"

    @property
    def first_epoch_whole(self) -> bool:
        """The first epoch must run to its end: with an iterable dataset, two or more
        persistent workers and a worker that runs out early, how many tasks torch sends the
        others before it hears of that is timing, and stopping early leaves those workers
        (their RNG, their counters) at a timing-dependent place for the second epoch."""
        return self.order_free or (
            self.style == "iter" and self.num_workers >= 2 and bool(self.persistent))

    @property
    def errors_allowed(self) -> bool:
        """Faults, and data default_collate refuses (which worker fails first is timing; an
        error ends the epoch early)."""
        return not self.first_epoch_whole

    @property
    def worker_init_faults(self) -> bool:
        return self.errors_allowed

    @property
    def mixed(self) -> bool:
        """Leaves whose type, dtype or shape changes from sample to sample."""
        return self.errors_allowed

    @property
    def stop_iteration(self) -> bool:
        """May the dataset or collate_fn raise StopIteration?"""
        return self.style == "iter" or not masked("stop_iteration_in_map_style")


@st.composite
def leaves(draw: Any, allow_bad: bool, mixed: bool = True) -> Leaf:
    kinds = ["np", "np", "torch", "torch", "npscalar", "tscalar", "int", "float", "bool", "str"]
    if allow_bad:
        kinds += ["bytes", "none", "obj", "np_str"]
    kind = draw(st.sampled_from(kinds))
    dtype = ""
    if kind in ("np", "npscalar"):
        dtype = draw(st.sampled_from(NP_DTYPES))
    elif kind in ("torch", "tscalar"):
        dtype = draw(st.sampled_from(TORCH_DTYPES))
    shape = draw(shapes) if kind in ("np", "torch") else ()
    source = "fresh"
    if kind in ("np", "torch"):
        source = draw(st.sampled_from(("fresh", "fresh", "view", "copy")))
    alt = None
    if mixed and source == "fresh" and rarely(draw, 5):  # mixed across samples
        alt = draw(leaves(allow_bad=False))
        if alt.source != "fresh":
            alt = Leaf(alt.kind, alt.dtype, alt.shape)
    return Leaf(kind, dtype, shape, source, alt)


def obs_leaves(names: tuple[str, ...]) -> st.SearchStrategy[Obs]:
    return st.lists(st.sampled_from(names), min_size=1, max_size=6, unique=True).map(
        lambda ns: Obs(tuple(ns))
    )


def nodes(children: st.SearchStrategy[Tree]) -> st.SearchStrategy[Node]:
    keyed = st.lists(children, min_size=1, max_size=4).flatmap(
        lambda cs: st.tuples(
            st.sampled_from(("dict", "dict", "tagged_dict")),
            st.just(tuple(cs)),
            st.lists(st.sampled_from(("a", "b", "img", "label", 0, 1, 7)), min_size=len(cs),
                     max_size=len(cs), unique=True).map(tuple),
        ).map(lambda t: Node(t[0], t[1], t[2]))
    )
    seq = st.tuples(
        st.sampled_from(("list", "tagged_list", "tuple")),
        st.lists(children, min_size=1, max_size=3).map(tuple),
    ).map(lambda t: Node(t[0], t[1]))
    named = st.sampled_from((2, 3)).flatmap(
        lambda k: st.lists(children, min_size=k, max_size=k).map(
            lambda cs: Node("namedtuple", tuple(cs))
        )
    )
    return st.one_of(keyed, seq, named)


def _count(tree: Tree) -> int:
    return sum(_count(c) for c in tree.children) if isinstance(tree, Node) else 1


def _add_refs(tree: Tree, picks: list[int], counter: list[int]) -> Tree:
    """Turn leaves into references to earlier leaves: ``picks[k]`` for leaf k (-1: keep)."""
    if isinstance(tree, Node):
        return Node(tree.kind, tuple(_add_refs(c, picks, counter) for c in tree.children),
                    tree.keys)
    number = counter[0]
    counter[0] += 1
    pick = picks[number]
    if pick < 0 or number == 0:
        return tree
    return Ref(target=pick % number, view=bool(pick % 2))


@st.composite
def trees(draw: Any, plan: Plan) -> Tree:
    """A sample's structure; what it may hold depends on the plan (see ``Plan``)."""
    obs_names = OBS_STABLE if plan.stable_only else OBS_NAMES
    allow_bad = plan.errors_allowed and rarely(draw, 5)
    leaf = leaves(allow_bad, mixed=plan.mixed)
    base = st.one_of(leaf, leaf, obs_leaves(obs_names))
    tree = draw(st.recursive(base, nodes, max_leaves=6))
    n = _count(tree)
    if n > 1 and rarely(draw, 3):
        picks = draw(st.lists(st.sampled_from((-1, -1, 0, 1, 2, 3)), min_size=n, max_size=n))
        tree = _add_refs(tree, picks, [0])
    if rarely(draw, 9):  # a process started per sample: about one case in twenty
        tree = Node("tuple", (tree, Obs(OBS_RARE)))
    return tree


def faults(n: int, stop: bool = True) -> st.SearchStrategy[Fault]:
    names = sorted(name for name in EXCEPTIONS if stop or name != "stop")
    return st.builds(Fault, st.integers(0, max(0, n)), st.sampled_from(names))


@st.composite
def collates(draw: Any, plan: Plan, tag: str) -> CollateSpec:
    names = COLLATE_OBS_STABLE if plan.stable_only else COLLATE_OBS
    bases: tuple[str, ...] = ("identity", "first", "convert")  # never fail
    # numpy fails on bfloat16 tensors: only where errors are compared.
    if plan.errors_allowed:
        bases += ("default", "default", "numpy")
    base = draw(st.sampled_from(bases))
    obs = tuple(draw(st.lists(st.sampled_from(names), max_size=4, unique=True)))
    fault = None
    if plan.errors_allowed:
        fault = draw(st.none() | st.none() | faults(3, plan.stop_iteration))
        if fault is not None and plan.num_workers > 1 and draw(st.booleans()):
            fault = Fault(fault.at, fault.exc, draw(st.integers(0, plan.num_workers - 1)))
    alias = draw(st.booleans())
    return CollateSpec(base, obs, alias, fault, tag)


@st.composite
def worker_inits(draw: Any, plan: Plan, tag: str) -> WorkerInitSpec:
    fault = None
    if plan.worker_init_faults:
        last = max(0, plan.num_workers - 1)
        fault = draw(st.none() | st.none() | st.none() | st.integers(0, last))
    return WorkerInitSpec(draw(st.booleans()), draw(st.booleans()), fault, tag)


@st.composite
def samplers(draw: Any, torch_style: bool = False, errors: bool = True) -> SamplerSpec:
    """With torch's own dataset classes also ``neg`` (negative indices) and ``np`` (numpy
    ints): indices torch's classes take and stoker's gathers decline. Without ``errors``
    (``Plan.errors_allowed``) no ``raising`` sampler: with ``in_order=False`` which batch
    arrives before its error is timing, under torch too."""
    kinds = SAMPLER_KINDS + (TORCH_DS_SAMPLER_KINDS if torch_style else ())
    if not errors:
        kinds = tuple(k for k in kinds if k != "raising")
    return SamplerSpec(draw(st.sampled_from(kinds)), draw(st.integers(0, 3)))


@st.composite
def batch_samplers(draw: Any, torch_style: bool = False, errors: bool = True) -> BatchSamplerSpec:
    kind = draw(st.sampled_from(("torch", "torch", "variable", "stateful", "progress")))
    if kind != "torch":
        return BatchSamplerSpec(kind)
    return BatchSamplerSpec(kind, draw(samplers(torch_style, errors)), draw(st.integers(1, 4)),
                            draw(st.booleans()))


def _maybe(draw: Any, args: list[tuple[str, Any]], name: str, values: st.SearchStrategy) -> None:
    """Pass ``name`` explicitly (drawn from ``values``) or leave torch's default."""
    if draw(st.booleans()):
        args.append((name, draw(values)))


@st.composite
def loader_args(draw: Any, plan: Plan) -> tuple[tuple[str, Any], ...]:
    args: list[tuple[str, Any]] = []
    style, num_workers, how = plan.style, plan.num_workers, plan.how
    if how == "batch_sampler":
        args.append(("batch_sampler",
                     draw(batch_samplers(style == "torch", plan.errors_allowed))))
    else:
        if plan.batch_size != "omit":
            args.append(("batch_size", plan.batch_size))
        if not plan.unbatched:
            _maybe(draw, args, "drop_last", st.booleans())
        if how == "sampler":
            args.append(("sampler", draw(samplers(style == "torch", plan.errors_allowed))))
        elif style != "iter":
            _maybe(draw, args, "shuffle", st.sampled_from((None, False, True)))
    if num_workers or draw(st.booleans()):
        args.append(("num_workers", num_workers))
    _maybe(draw, args, "collate_fn", st.none() | collates(plan, "c0"))
    _maybe(draw, args, "pin_memory", st.booleans())
    if rarely(draw, 9):
        args.append(("pin_memory_device", "cpu"))  # deprecated: torch warns with pin_memory
    if num_workers:
        args.append(("timeout", draw(st.sampled_from(WORKER_TIMEOUT_S))))
        _maybe(draw, args, "worker_init_fn", st.none() | worker_inits(plan, "w0"))
        _maybe(draw, args, "prefetch_factor", st.sampled_from((None, 1, 2, 3)))
        if plan.persistent is not None:
            args.append(("persistent_workers", plan.persistent))
        if rarely(draw, 9):  # the workers are then ForkProcess-N, not Process-N
            args.append(("multiprocessing_context", "fork"))
    else:
        _maybe(draw, args, "timeout", st.sampled_from((0, 5.0)))
        _maybe(draw, args, "worker_init_fn", st.none() | worker_inits(plan, "w0"))
    _maybe(draw, args, "generator", st.none() | st.integers(0, 3))
    if plan.in_order is not None:
        args.append(("in_order", plan.in_order))
    if rarely(draw, 9):
        args.append(draw(_invalid_arg(style, num_workers)))
    perm = draw(st.permutations(range(len(args))))
    return tuple(args[i] for i in perm)


def _invalid_arg(style: str, num_workers: int) -> st.SearchStrategy[tuple[str, Any]]:
    """One argument torch refuses at construction (with this dataset and worker count)."""
    bad: list[tuple[str, Any]] = [("timeout", -1.0), ("batch_size", 0)]
    if style == "iter":
        bad += [("shuffle", True), ("sampler", SamplerSpec("seq")),
                ("batch_sampler", BatchSamplerSpec("variable"))]
    if num_workers == 0:
        bad += [("prefetch_factor", 2), ("persistent_workers", True),
                ("multiprocessing_context", "fork")]
    else:
        bad += [("prefetch_factor", 0)]
    return st.sampled_from(bad)


@st.composite
def epochs(draw: Any, plan: Plan) -> tuple[EpochSpec, ...]:
    ops: list[Op] = []
    if draw(st.booleans()):
        ops.append(Op("worker_init_fn", draw(st.none() | worker_inits(plan, "w1"))))
    if draw(st.booleans()):
        new_collate = collates(plan, "c1")
        if plan.errors_allowed:
            new_collate = st.none() | new_collate  # torch then calls None: TypeError
        ops.append(Op("collate_fn", draw(new_collate)))
    if rarely(draw, 3):
        ops.append(Op("generator", draw(st.none() | st.integers(4, 6))))
    if plan.num_workers_op is not None:
        ops.append(Op("num_workers", plan.num_workers_op))
    if rarely(draw, 7):
        ops.append(Op(draw(st.sampled_from(("batch_size", "drop_last", "sampler"))), None))
    if plan.style == "torch" and draw(st.booleans()):
        ops.append(Op("write_tables"))
    if rarely(draw, 3):
        ops.append(Op("patch_torch", draw(st.sampled_from(sorted(PATCHES)))))
    if rarely(draw, 3):
        ops.append(Op("torch_mode", draw(st.sampled_from(MODES))))
    specs = []
    for number in range(2):
        early = plan.order_free or (number == 0 and plan.first_epoch_whole)
        stop = None if early else draw(st.none() | st.none() | st.integers(1, 3))
        specs.append(EpochSpec(
            ops=tuple(ops) if number == 1 else (),
            stop_after=stop,
            continue_on_error=draw(st.booleans()),
            hold=draw(st.booleans()),
        ))
    return tuple(specs)


@st.composite
def plans(draw: Any) -> Plan:
    style = draw(st.sampled_from(("map", "map", "map_getitems", "iter", "iter", "torch",
                                  "torch", "formats")))
    num_workers = draw(st.sampled_from((0, 0, 1, 2, 2, 3)))
    in_order = draw(st.sampled_from((None, None, True, False)))
    persistent = draw(st.sampled_from((None, False, True))) if num_workers else None
    num_workers_op = None
    if in_order is None and rarely(draw, 5):
        num_workers_op = draw(st.integers(0, 2))
    how = "plain"
    if style != "iter":
        how = draw(st.sampled_from(("plain", "plain", "sampler", "batch_sampler")))
    batch_size: int | None | str = "omit"
    if how != "batch_sampler" and draw(st.booleans()):
        batch_size = draw(st.sampled_from((None, 1, 2, 3, 5)))
    return Plan(style, num_workers, in_order, num_workers_op, persistent, how, batch_size)


@st.composite
def cases(draw: Any) -> Case:
    plan = draw(plans())
    n = draw(st.integers(1, 11)) if not rarely(draw, 9) else 0
    if plan.style == "torch":
        return draw(_torch_case(plan, n))
    if plan.style == "formats":
        return draw(_formats_case(plan, n))
    tree = draw(trees(plan))
    fault = None
    if plan.errors_allowed:  # an iterable's __iter__ ending with StopIteration is its end
        stop = plan.stop_iteration or plan.style == "iter"
        fault = draw(st.none() | st.none() | faults(n, stop))
    split = draw(st.sampled_from(("shard", "dup", "uneven", "first")))
    length = draw(st.sampled_from(("none", "true", "lie")))
    gen = rarely(draw, 4)
    modes = WARN_MODES
    if not plan.errors_allowed and plan.style == "iter" and length != "none":
        # torch warns at next() once an iterable outruns its __len__; under "error" that ends
        # the epoch after a timing-dependent set of batches (see Plan.errors_allowed)
        modes = tuple(m for m in WARN_MODES if m != "error")
    return _case(draw, plan, DatasetSpec(plan.style, n, tree, fault, split, length, gen), modes)


def _case(draw: Any, plan: Plan, dataset: DatasetSpec,
          modes: tuple[str, ...] = WARN_MODES) -> Case:
    """The case around ``dataset``: loader arguments, epochs and how it is run, drawn for
    ``plan``; ``modes``, the warning filters it may run under (besides recording all)."""
    return Case(
        dataset=dataset,
        args=draw(loader_args(plan)),
        epochs=draw(epochs(plan)),
        len_first=draw(st.booleans()),
        main_seed=draw(st.integers(0, 3)),
        warn=draw(st.sampled_from(modes + ("record",))),
        started="background" if rarely(draw, 5) else "terminal",
    )


@st.composite
def _torch_case(draw: Any, plan: Plan, n: int) -> Case:
    """A case over torch's own dataset classes (``_fuzz_torch_ds``); where errors are
    compared, sometimes shorter than the samplers believe (indices out of range)."""
    real = n
    if plan.errors_allowed and n and rarely(draw, 4):
        real = n - draw(st.integers(1, min(2, n)))
    torch_ds = draw(torch_datasets(real, plan.errors_allowed, not plan.workers_ever))
    return _case(draw, plan, DatasetSpec("torch", n, Leaf("int"), torch_ds=torch_ds))


@st.composite
def _formats_case(draw: Any, plan: Plan, n: int) -> Case:
    """A case over stoker's own formats (``_fuzz_formats``): tar shards read by TarShards."""
    format_ds = draw(format_datasets(n, plan.errors_allowed, not plan.stable_only))
    return _case(draw, plan, DatasetSpec("formats", n, Leaf("int"), format_ds=format_ds))
