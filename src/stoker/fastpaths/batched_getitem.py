"""A dataset's ``__getitem__`` read from its source and run once per batch.

NOTE [ Batched getitem from source ]
The commonest in-memory dataset is one expression over array attributes::

    def __getitem__(self, i):
        return {"x": self.x[i], "y": int(self.y[i])}

Called with a tensor of indices it raises (``int`` of many values), yet its batch is two
gathers. ``compile_batched`` parses ``type(dataset).__getitem__``'s source and, when the body
is only assignments and one ``return`` built from the forms below, builds a function that
computes the collated batch directly:

* ``self.<attr>[<index>]``: on a CPU tensor or ndarray, one gather for the whole batch (straight
  into the slab when it is a leaf of the batch); on a list or tuple (or a worker's read-only
  stand-in for one, NOTE [ Reading inherited lists in place ]), the items one by one;
* ``int(e)``, ``float(e)``, ``bool(e)``, ``e.item()``: Python scalars, which ``default_collate``
  turns into int64 / float64 / bool tensors: one cast of the gathered values;
* ``torch.as_tensor(e)``, ``torch.from_numpy(e)``, ``torch.tensor(e)`` of an array; the tensor
  methods ``float double half long int bool clone contiguous`` and ``to(<torch dtype>)``; the
  ndarray methods ``copy`` and ``astype(<numpy dtype or its name>)``;
* ``e + c``, ``e - c``, ``e * c``, ``e / c``, ``e % c``, ``e // c`` (either side) with a numeric
  constant ``c``, and ``-e``: on arrays the same elementwise kernel as for one sample; on Python
  numbers (the index, ``int(...)``, ``float(...)``) Python's own results, computed in int64 or
  float64 only where those equal them (no int64 overflow, ints exact as floats before ``/``,
  no division by zero, no float ``%``/``//``), else the batch declines;
* ``tuple(t[<index>] for t in self.<attr>)`` (or ``list(...)``) over a tuple or list of
  arrays: TensorDataset's own ``__getitem__``, one gather per array;
* the index itself; dict displays with constant keys, tuple and list displays, names
  assigned earlier.

Attributes are read without running user code: a property (or any descriptor) declines.

Anything else (another call, a branch, a loop, a decorator, a global named ``int`` or
``torch`` that is something else) and there is no batched form. Each batch re-reads the
attributes, and the form declines (``Decline``: that batch is fetched sample by sample) wherever
the batch might differ from what the per-sample code gives, or the per-sample code might raise:
indices that are not plain ints, an index out of range, a source that is no longer a CPU array,
``int`` of a value that is not finite, a sample of several values turned into a scalar. It
calls no user code and draws no random numbers, so its batches need no seeding. Before it is
used, its batches are compared with the plain path's (NOTE [ Vectorised fetch ]).
"""

from __future__ import annotations

import ast
import builtins
import inspect
import textwrap
import types
import weakref
from typing import Any

import numpy as np
import torch

from stoker.fastpaths.batched_columns import (
    _MISSING,
    Decline,
    Node,
    _Array,
    _Batch,
    _Items,
    _Scalars,
    _Unsupported,
)
from stoker.fastpaths.batched_nodes import (
    _BINOPS,
    _TENSOR_METHODS,
    _binop,
    _display,
    _gather,
    _gather_each,
    _index,
    _method,
    _negate,
    _scalar,
    _to_tensor,
)
from stoker.fastpaths.source_check import runs_this_source

__all__ = ["BatchedGetitem", "Decline", "compile_batched"]
# -- compiling the source ---------------------------------------------------------------------


class _Compiler:
    def __init__(self, fn: types.FunctionType, self_name: str, index_name: str) -> None:
        self.globals = fn.__globals__
        self.self_name = self_name
        self.index_name = index_name
        self.locals: dict[str, Node] = {}

    def _resolve(self, node: ast.expr) -> Any:
        """The object ``node`` names as a global, builtin or dotted attribute of one (like
        ``torch.from_numpy``); ``_MISSING`` for locals, ``self``, the index and expressions."""
        if isinstance(node, ast.Name):
            if node.id in self.locals or node.id in (self.self_name, self.index_name):
                return _MISSING
            return self.globals.get(node.id, getattr(builtins, node.id, _MISSING))
        if isinstance(node, ast.Attribute):
            base = self._resolve(node.value)
            return _MISSING if base is _MISSING else getattr(base, node.attr, _MISSING)
        return _MISSING

    @staticmethod
    def _number(node: ast.expr) -> int | float | None:
        """A numeric constant (``-2`` is a unary minus on ``2`` in the tree)."""
        sign = 1
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            node, sign = node.operand, -1
        value = node.value if isinstance(node, ast.Constant) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return sign * value
        return None

    def _dtype(self, node: ast.expr) -> np.dtype:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return np.dtype(node.value)
        value = self._resolve(node)
        if isinstance(value, type) and issubclass(value, np.generic):
            return np.dtype(value)
        raise _Unsupported

    def expr(self, node: ast.expr) -> Node:
        if isinstance(node, ast.Name) and node.id in self.locals:
            return self.locals[node.id]
        if isinstance(node, ast.Name) and node.id == self.index_name:
            return _index
        if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name)
                and node.slice.id == self.index_name and isinstance(node.value, ast.Attribute)
                and isinstance(node.value.value, ast.Name)
                and node.value.value.id == self.self_name):
            return _gather(node.value.attr)
        if isinstance(node, ast.Dict):
            if not all(isinstance(k, ast.Constant) for k in node.keys):
                raise _Unsupported
            keys = [k.value for k in node.keys]  # type: ignore[union-attr]
            return _display(dict, keys, [self.expr(v) for v in node.values])
        if isinstance(node, ast.Tuple | ast.List):
            kind = tuple if isinstance(node, ast.Tuple) else list
            if any(isinstance(e, ast.Starred) for e in node.elts):
                raise _Unsupported
            return _display(kind, None, [self.expr(e) for e in node.elts])
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            for const, other, left in ((node.right, node.left, True),
                                       (node.left, node.right, False)):
                value = self._number(const)
                if value is not None:
                    return _binop(type(node.op), self.expr(other), value, left)
            raise _Unsupported
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return _negate(self.expr(node.operand))
        if isinstance(node, ast.Call) and not node.keywords:
            return self._call(node)
        raise _Unsupported

    def _each(self, node: ast.expr) -> str | None:
        """``self.<attr>`` of a generator ``<t>[<index>] for <t> in self.<attr>``, or None."""
        if not isinstance(node, ast.GeneratorExp) or len(node.generators) != 1:
            return None
        gen, elt = node.generators[0], node.elt
        if (gen.ifs or gen.is_async or not isinstance(gen.target, ast.Name)
                or gen.target.id in (self.self_name, self.index_name)):
            return None
        if not (isinstance(gen.iter, ast.Attribute) and isinstance(gen.iter.value, ast.Name)
                and gen.iter.value.id == self.self_name):
            return None
        if (isinstance(elt, ast.Subscript) and isinstance(elt.value, ast.Name)
                and elt.value.id == gen.target.id and isinstance(elt.slice, ast.Name)
                and elt.slice.id == self.index_name):
            return gen.iter.attr
        return None

    def _call(self, node: ast.Call) -> Node:
        func, args = node.func, node.args
        for sequence in (tuple, list):
            if len(args) == 1 and self._resolve(func) is sequence:
                attr = self._each(args[0])
                if attr is not None:
                    return _gather_each(attr, sequence)
        for kind in ("int", "float", "bool"):
            if len(args) == 1 and self._resolve(func) is getattr(builtins, kind):
                return _scalar(kind, self.expr(args[0]))
        for name in ("as_tensor", "from_numpy", "tensor"):
            if len(args) == 1 and self._resolve(func) is getattr(torch, name):
                return _to_tensor(name, self.expr(args[0]))
        if isinstance(func, ast.Attribute) and self._resolve(func.value) is _MISSING:
            if func.attr == "item" and not args:
                return _scalar("item", self.expr(func.value))
            if (func.attr in _TENSOR_METHODS or func.attr == "copy") and not args:
                return _method(func.attr, self.expr(func.value))
            if func.attr == "astype" and len(args) == 1:
                return _method("astype", self.expr(func.value), self._dtype(args[0]))
            if func.attr == "to" and len(args) == 1:
                dtype = self._resolve(args[0])
                if isinstance(dtype, torch.dtype):
                    return _method("to", self.expr(func.value), dtype)
        raise _Unsupported

    def body(self, statements: list[ast.stmt]) -> Node:
        if (statements and isinstance(statements[0], ast.Expr)
                and isinstance(statements[0].value, ast.Constant)):
            statements = statements[1:]  # the docstring
        for stmt in statements[:-1]:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)
                    and stmt.targets[0].id not in (self.self_name, self.index_name)):
                raise _Unsupported
            self.locals[stmt.targets[0].id] = self.expr(stmt.value)
        if not statements or not isinstance(statements[-1], ast.Return) or (
                statements[-1].value is None):
            raise _Unsupported
        return self.expr(statements[-1].value)


def _getitem_function(dataset: Any) -> types.FunctionType | None:
    for klass in type(dataset).__mro__:
        if "__getitem__" in klass.__dict__:
            fn = klass.__dict__["__getitem__"]
            return fn if isinstance(fn, types.FunctionType) else None
    return None


# Per function, its compiled form or None. Filled in the main process before workers are
# forked, so they inherit it: reading the source costs 0.5-7 ms in a fresh child.
_COMPILED: weakref.WeakKeyDictionary[types.FunctionType, Node | None] = (
    weakref.WeakKeyDictionary()
)


def _compile(fn: types.FunctionType) -> Node | None:
    if fn.__closure__:
        return None
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    if not runs_this_source(fn):
        return None  # the file changed since it was imported: the source is not the code
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        return None
    fdef = tree.body[0]
    a = fdef.args
    if (fdef.decorator_list or fdef.name != fn.__name__ or len(a.args) != 2 or a.posonlyargs
            or a.vararg or a.kwarg or a.kwonlyargs or a.defaults):
        return None
    try:
        return _Compiler(fn, a.args[0].arg, a.args[1].arg).body(fdef.body)
    except (_Unsupported, TypeError, ValueError):
        return None


class BatchedGetitem:
    """``dataset``'s batched form: call it with a list of indices for the collated batch."""

    __slots__ = ("_dataset", "_root", "collates_objects")

    def __init__(self, dataset: Any, root: Node) -> None:
        self._dataset, self._root = dataset, root
        # Whether the last batch collated per-sample objects other than Python scalars and
        # strings (tensors or dicts from a list): that collate is real work, not a gather.
        self.collates_objects = False

    def __call__(self, indices: list[int]) -> Any:
        if not indices or set(map(type, indices)) != _INT_ONLY:
            raise Decline
        try:
            value = self._root(_Batch(self._dataset, indices))
            self.collates_objects = False
            return self._finalize(value)
        except Decline:
            raise
        except Exception as exc:  # whatever went wrong, one sample at a time will tell
            raise Decline from exc

    def _finalize(self, value: Any, in_sequence: bool = False) -> Any:
        from stoker.collate import default_collate

        if isinstance(value, _Array):
            return value.leaf()
        if isinstance(value, _Scalars):
            return value.values
        if isinstance(value, _Items):
            if not all(type(v) in _SCALAR_TYPES for v in value.items):
                self.collates_objects = True
            # default_collate transposes a sequence sample with zip: its columns are tuples.
            return default_collate(tuple(value.items) if in_sequence else value.items)
        if isinstance(value, dict):
            return {k: self._finalize(v) for k, v in value.items()}
        if isinstance(value, tuple | list):
            return [self._finalize(v, True) for v in value]  # default_collate: lists for both
        raise Decline


_SCALAR_TYPES = frozenset({int, float, bool, str, bytes})
_INT_ONLY = {int}


def compile_batched(dataset: Any) -> BatchedGetitem | None:
    """``dataset``'s batched form, or ``None`` when ``__getitem__`` is not of the form in
    NOTE [ Batched getitem from source ]."""
    fn = _getitem_function(dataset)
    if fn is None:
        return None
    if fn in _COMPILED:
        root = _COMPILED[fn]
    else:
        root = _COMPILED[fn] = _compile(fn)
    return None if root is None else BatchedGetitem(dataset, root)
