"""Expression nodes of a batched ``__getitem__`` (NOTE [ Batched getitem from source ] in
``batched_getitem``): each computes one sub-expression's values for every sample of a batch."""

from __future__ import annotations

import ast
import builtins
import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from stoker.fastpaths.batched_columns import (
    _MISSING,
    Decline,
    Node,
    _Array,
    _array_source,
    _Batch,
    _Items,
    _Scalars,
)
from stoker.sharing.read_only import ReadOnlySequence


def _index(b: _Batch) -> _Scalars:
    """The index itself: Python ints, which collate into an int64 tensor (its own storage,
    resizable like collate's, not a view of the rows' numpy array)."""
    return _Scalars(b.rows_tensor().clone())


def _plain_attribute(obj: Any, attr: str) -> Any:
    """``obj.attr`` when it is plain data (no property or other descriptor runs)."""
    found = inspect.getattr_static(obj, attr, _MISSING)
    if found is _MISSING or hasattr(type(found), "__get__"):
        raise Decline
    return found


def _gather(attr: str) -> Node:
    def run(b: _Batch) -> Any:
        source = _plain_attribute(b.dataset, attr)
        if _array_source(source):
            return _Array(source=source, rows=b.rows_for(source))
        if type(source) in (list, tuple) or isinstance(source, ReadOnlySequence):
            return _Items([source[i] for i in b.indices])  # incl. a worker's inherited list
        raise Decline

    return run


def _gather_each(attr: str, kind: type) -> Node:
    """``kind(t[index] for t in self.<attr>)`` (TensorDataset's form): one gather per array."""

    def run(b: _Batch) -> Any:
        sources = _plain_attribute(b.dataset, attr)
        if type(sources) not in (tuple, list) or not all(map(_array_source, sources)):
            raise Decline
        return kind(_Array(source=s, rows=b.rows_for(s)) for s in sources)

    return run


def _single_values(col: _Array) -> torch.Tensor:
    """The samples' values as a 1-D tensor, when each sample holds exactly one."""
    data = col.data
    if isinstance(data, np.ndarray) and data.ndim != 1:
        raise Decline  # numpy deprecates int()/float() of an array with ndim > 0
    t = col.tensor()
    if t.dim() == 0 or math.prod(t.shape[1:]) != 1 or t.is_complex():
        raise Decline
    return t.reshape(len(t))


def _as_int64(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.bool or not t.is_floating_point():
        if t.dtype == torch.uint64 and len(t) and int(t.max()) >= 2**63:
            raise Decline  # a Python int that collate cannot turn into int64
        return t.to(torch.int64)
    if len(t) and not (bool(torch.isfinite(t).all()) and float(t.abs().max()) < 2.0**63):
        raise Decline  # int() raises or overflows int64 there
    return t.to(torch.int64)  # truncation toward zero, as int() does


_SCALAR_CASTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "int": _as_int64,
    "float": lambda t: t.to(torch.float64),
    "bool": lambda t: t.to(torch.bool),
}


def _item_cast(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.bool:
        return t
    return t.to(torch.float64) if t.is_floating_point() else _as_int64(t)


def _scalar(kind: str, child: Node) -> Node:
    python = getattr(builtins, kind) if kind != "item" else None
    cast = _SCALAR_CASTS[kind] if kind != "item" else _item_cast

    def run(b: _Batch) -> Any:
        col = child(b)
        if isinstance(col, _Items):
            if python is None:
                return _Items([v.item() for v in col.items])
            return _Items([python(v) for v in col.items])
        if isinstance(col, _Scalars):
            if python is None:
                raise Decline  # a Python number has no .item()
            return _Scalars(cast(col.values))
        if isinstance(col, _Array):
            return _Scalars(cast(_single_values(col)))
        raise Decline

    return run


_TENSOR_METHODS = {"float", "double", "half", "long", "int", "bool", "clone", "contiguous"}
_INT_CASTS = {"long", "int"}


def _method(name: str, child: Node, dtype: Any = None) -> Node:
    """A method call; ``dtype`` is the argument of ``astype`` (numpy) or ``to`` (torch)."""

    def run(b: _Batch) -> Any:
        col = child(b)
        if isinstance(col, _Items):
            if dtype is not None:
                return _Items([getattr(v, name)(dtype) for v in col.items])
            return _Items([getattr(v, name)() for v in col.items])
        if not isinstance(col, _Array):
            raise Decline
        data = col.data
        if name in _TENSOR_METHODS and isinstance(data, torch.Tensor):
            if name in _INT_CASTS and data.is_floating_point():
                raise Decline  # NaN/inf casts are not defined: do not rely on them agreeing
            return _Array(getattr(data, name)())
        if name == "to" and isinstance(data, torch.Tensor):
            if data.is_floating_point() and not (dtype.is_floating_point or dtype.is_complex):
                raise Decline  # as for .long(): float -> int casts of NaN/inf are undefined
            return _Array(data.to(dtype))
        if name == "copy" and isinstance(data, np.ndarray):
            return _Array(data.copy())
        if name == "astype" and isinstance(data, np.ndarray) and dtype is not None:
            if data.dtype.kind == "f" and dtype.kind in "iub":
                raise Decline
            return _Array(data.astype(dtype))
        raise Decline

    return run


def _to_tensor(name: str, child: Node) -> Node:
    def run(b: _Batch) -> Any:
        col = child(b)
        if isinstance(col, _Items):
            fn = getattr(torch, name)
            return _Items([fn(v) for v in col.items])
        if isinstance(col, _Scalars) and name != "from_numpy":
            # A Python int gives int64, a bool bool, a float the default dtype: 0-d tensors.
            values = col.values
            if values.dtype == torch.float64:
                values = values.to(torch.get_default_dtype())
            return _Array(values)
        if not isinstance(col, _Array):
            raise Decline
        data = col.data
        if isinstance(data, torch.Tensor):
            if name != "as_tensor":
                raise Decline  # from_numpy raises, torch.tensor warns: one sample says so
            return col
        if name == "from_numpy" and data.ndim < 2:
            raise Decline  # a sample is a numpy scalar: from_numpy raises for it
        return _Array(torch.from_numpy(data) if name == "from_numpy" else torch.tensor(data)
                      if name == "tensor" else torch.as_tensor(data))

    return run


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, c: a + c,
    ast.Sub: lambda a, c: a - c,
    ast.Mult: lambda a, c: a * c,
    ast.Div: lambda a, c: a / c,
    ast.Mod: lambda a, c: a % c,
    ast.FloorDiv: lambda a, c: a // c,
}
_INT64_MAX = 2**63 - 1
_EXACT_FLOAT_INT = 2**53  # ints up to this convert to float64 exactly


def _python_ints(op: type, values: torch.Tensor, const: int, left: bool) -> torch.Tensor:
    """``values <op> const`` (or ``const <op> values``) as Python would compute it for each
    int, when int64 arithmetic gives exactly that; declines otherwise."""
    lo, hi = (int(values.min()), int(values.max())) if len(values) else (0, 0)
    if op is ast.Div:
        if max(abs(lo), abs(hi), abs(const)) > _EXACT_FLOAT_INT or (left and const == 0) or (
                not left and lo <= 0 <= hi):
            raise Decline  # int / int is float(a) / float(b) only for exact floats; 1/0 raises
        floats = values.to(torch.float64)
        return floats / float(const) if left else float(const) / floats
    if op in (ast.Mod, ast.FloorDiv):
        if max(abs(lo), abs(hi), abs(const)) >= 2**62 or (left and const == 0) or (
                not left and lo <= 0 <= hi):
            raise Decline  # x % 0 raises; far from int64's ends, torch's floor ops are Python's
        num, den = values, torch.full_like(values, const)
        if not left:
            num, den = den, num
        if op is ast.Mod:
            return torch.remainder(num, den)
        return torch.div(num, den, rounding_mode="floor")
    ends = [_BINOPS[op](v, const) if left else _BINOPS[op](const, v) for v in (lo, hi)]
    if max(abs(e) for e in ends) > _INT64_MAX:  # +, -, * are monotonic: the ends bound all
        raise Decline
    return _BINOPS[op](values, const) if left else _BINOPS[op](const, values)


def _python_numbers(op: type, col: _Scalars, const: int | float, left: bool) -> _Scalars:
    """Arithmetic on per-sample Python numbers, exactly as Python does it."""
    values = col.values
    if values.dtype == torch.bool:
        values = values.to(torch.int64)  # True + 1 == 2: bools compute as ints
    if values.dtype == torch.int64 and isinstance(const, int):
        return _Scalars(_python_ints(op, values, const, left))
    if op in (ast.Mod, ast.FloorDiv):
        raise Decline  # float % and // have their own sign and rounding rules
    if values.dtype == torch.int64:
        if len(values) and int(values.abs().max()) > _EXACT_FLOAT_INT:
            raise Decline
        values = values.to(torch.float64)  # int op float: Python converts the int first
    if op is ast.Div and ((left and const == 0) or (not left and bool((values == 0).any()))):
        raise Decline  # ZeroDivisionError in Python, inf here
    c = float(const)
    if isinstance(const, int) and abs(const) > _EXACT_FLOAT_INT:
        raise Decline
    return _Scalars(_BINOPS[op](values, c) if left else _BINOPS[op](c, values))


def _binop(op: type, child: Node, const: int | float, left: bool) -> Node:
    fn = _BINOPS[op]

    def run(b: _Batch) -> Any:
        col = child(b)
        if isinstance(col, _Items):
            return _Items([fn(v, const) if left else fn(const, v) for v in col.items])
        if isinstance(col, _Scalars):
            return _python_numbers(op, col, const, left)
        if not isinstance(col, _Array):
            raise Decline
        data = col.data
        if isinstance(data, np.ndarray) and data.ndim == 1:
            raise Decline  # numpy scalars: promotion rules of scalars and arrays may differ
        return _Array(fn(data, const) if left else fn(const, data))

    return run


def _negate(child: Node) -> Node:
    def run(b: _Batch) -> Any:
        col = child(b)
        if isinstance(col, _Items):
            return _Items([-v for v in col.items])
        if isinstance(col, _Scalars):
            return _python_numbers(ast.Sub, col, 0, left=False)  # -x == 0 - x, also for bools
        if not isinstance(col, _Array):
            raise Decline
        data = col.data
        if isinstance(data, np.ndarray) and data.ndim == 1:
            raise Decline
        return _Array(-data)

    return run


def _display(kind: type, keys: list[Any] | None, items: list[Node]) -> Node:
    def run(b: _Batch) -> Any:
        values = [item(b) for item in items]
        if keys is not None:
            return dict(zip(keys, values, strict=True))
        return kind(values)

    return run
