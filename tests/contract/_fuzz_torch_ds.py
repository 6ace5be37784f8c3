"""torch's own dataset classes for the differential fuzzer: ``TensorDataset``, ``StackDataset``
(tuple and dict), ``Subset``, ``ConcatDataset`` and bare tensors, nested, built from a
``TorchDS`` spec (``_fuzz_spec``).

stoker gathers these by default where it can show the batch is torch's (NOTE [ torch's own
datasets ] in ``stoker.fastpaths.torch_datasets``) and fetches sample by sample everywhere
else; the cases here aim at both sides of every condition of that NOTE: rows of every dtype
(bool, bfloat16, complex...), 0-d rows and empty rows, tensors that are not contiguous, at a
storage offset, requiring grad (without workers), ``nn.Parameter``s, or in memory the
workers share (``share_memory_()``, an anonymous shared ``mmap``), written between epochs
(``write_tables``); ``Subset`` indices
that are negative, out of range or a tensor; ``ConcatDataset`` parts of length 0 and parts
whose samples differ (dtypes, structures); a dataset shorter than the sampler believes
(indices out of range). The samplers with negative or numpy indices are ``_fuzz_callables``'
``neg`` and ``np``.
"""

from __future__ import annotations

import mmap
from typing import Any

import torch
from _fuzz_cases import _tensor
from _fuzz_spec import Leaf, TensorSpec, TorchDS
from hypothesis import strategies as st
from torch.utils.data import ConcatDataset, StackDataset, Subset, TensorDataset

TORCH_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                "uint8", "bool", "complex64")
row_shapes = st.lists(st.sampled_from((0, 1, 2, 3)), max_size=2).map(tuple)
_GRAD = ("float32", "float64", "float16", "bfloat16", "complex64")


@st.composite
def tensor_specs(draw: Any, grad: bool) -> TensorSpec:
    dtype = draw(st.sampled_from(TORCH_DTYPES))
    layouts = ["plain", "plain", "plain", "noncontig", "offset", "param", "shared", "mapped"]
    if grad and dtype in _GRAD:
        layouts.append("grad")
    return TensorSpec(dtype, draw(row_shapes), draw(st.sampled_from(layouts)))


@st.composite
def torch_datasets(draw: Any, n: int, errors: bool, grad: bool, depth: int = 0) -> TorchDS:
    """A dataset of length ``n``; with ``errors``, some of its indices may be out of range;
    with ``grad``, some tensors require grad (only where no worker runs: torch's worker then
    fails to send the batch, and its main process waits for the timeout)."""
    kinds = ["tensors", "tensors", "tensor"]
    if depth < 2:
        kinds += ["stack", "stack_dict", "subset", "concat"]
    kind = draw(st.sampled_from(kinds))
    if kind in ("tensors", "tensor"):
        k = 1 if kind == "tensor" else draw(st.integers(1, 3))
        return TorchDS(kind, n, tuple(draw(tensor_specs(grad)) for _ in range(k)))
    if kind in ("stack", "stack_dict"):
        k = draw(st.integers(1, 3))
        children = tuple(draw(torch_datasets(n, errors, grad, depth + 1)) for _ in range(k))
        keys: tuple[str, ...] = ()
        if kind == "stack_dict":
            keys = tuple(draw(st.lists(st.sampled_from(("x", "y", "img", "label", "a")),
                                       min_size=k, max_size=k, unique=True)))
        return TorchDS(kind, n, children, keys)
    if kind == "subset":
        m = draw(st.integers(1 if n else 0, 6))
        valid = st.integers(-m, m - 1) if m else st.nothing()
        values = valid | st.integers(-m - 2, m + 1) if errors else valid
        indices = tuple(draw(st.lists(values, min_size=n, max_size=n))) if n else ()
        form = draw(st.sampled_from(("list", "list", "tuple", "tensor")))
        return TorchDS(kind, n, (draw(torch_datasets(m, errors, grad, depth + 1)),), (form,),
                       indices)
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=0, max_size=2)))
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
    if not errors:
        # Parts whose samples differ (structure, dtype, row shape) make default_collate refuse
        # a batch that spans them: an error, which where errors are not compared (order-free
        # plans: which batch fails first is timing) must not happen. One part's tensors, at
        # each part's length.
        template = draw(torch_datasets(sizes[0], errors, grad, depth=2))  # tensors only
        return TorchDS("concat", n, tuple(TorchDS(template.kind, m, template.children)
                                          for m in sizes))
    return TorchDS("concat", n, tuple(draw(torch_datasets(m, errors, grad, depth + 1))
                                      for m in sizes))


class _Builder:
    def __init__(self) -> None:
        self.tables: dict[int, Any] = {}

    def tensor(self, spec: TensorSpec, rows: int) -> torch.Tensor:
        number = len(self.tables)
        base = 1000 * (number + 1)
        if spec.layout == "noncontig":
            t = _tensor(Leaf("torch", spec.dtype, (2 * rows, *spec.shape)), base)[::2]
        elif spec.layout == "offset":
            t = _tensor(Leaf("torch", spec.dtype, (rows + 1, *spec.shape)), base)[1:]
        else:
            t = _tensor(Leaf("torch", spec.dtype, (rows, *spec.shape)), base)
        if spec.layout == "grad":
            t.requires_grad_(True)
        elif spec.layout == "param":
            t = torch.nn.Parameter(t, requires_grad=False)
        elif spec.layout == "shared":
            t.share_memory_()
        elif spec.layout == "mapped" and t.nbytes:
            # an anonymous shared mapping (mmap's default): torch's forked workers read it live
            mapped = torch.frombuffer(mmap.mmap(-1, t.nbytes), dtype=t.dtype).view(t.shape)
            t = mapped.copy_(t)
        self.tables[number] = t
        return t

    def build(self, spec: TorchDS) -> Any:
        kind = spec.kind
        if kind == "tensor":
            return self.tensor(spec.children[0], spec.n)
        if kind == "tensors":
            return TensorDataset(*(self.tensor(c, spec.n) for c in spec.children))
        if kind == "stack":
            return StackDataset(*(self.build(c) for c in spec.children))
        if kind == "stack_dict":
            return StackDataset(**{k: self.build(c)
                                   for k, c in zip(spec.keys, spec.children, strict=True)})
        if kind == "subset":
            form = spec.keys[0] if spec.keys else "list"
            indices: Any = list(spec.indices)
            if form == "tuple":
                indices = tuple(indices)
            elif form == "tensor":
                indices = torch.tensor(indices, dtype=torch.int64)
            return Subset(self.build(spec.children[0]), indices)
        return ConcatDataset([self.build(c) for c in spec.children])


def write_tables(ds: Any) -> None:
    """Reverse the rows of each of the dataset's tensors in place, as a program might change
    its data between epochs: persistent workers see it where they share the tensor's memory
    (``shared``, ``mapped``), and not where their fork copied it."""
    with torch.no_grad():
        for t in ds.tables.values():
            t.copy_(t.flip(0))


def build_torch_ds(spec: TorchDS) -> Any:
    """The dataset, with ``tables``: its tensors (for the record's aliasing check)."""
    builder = _Builder()
    ds = builder.build(spec)
    ds.tables = builder.tables  # a bare tensor takes attributes too
    return ds
