"""Whether a function's source, as read from its file now, is the code that runs.

``inspect.getsource`` reads the file on disk, which may have been edited since the module was
imported (a notebook's helper file, a hot-edited script). A batched form compiled from that text
would compute what the new text says while ``__getitem__`` runs the old code. So the file's
current text is compiled again and the function's code object found in it (by qualified name)
is compared with the running one: bytecode, constants (and nested code, recursively), names and
variables; line numbers may differ.
Anything that does not compare equal refuses the batched form (NOTE [ Batched getitem from
source ]).
"""

from __future__ import annotations
import __future__

import linecache
import types
from typing import Any

_FUTURE_FLAGS = 0
for _name in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _name).compiler_flag


def _same_constant(a: Any, b: Any) -> bool:
    if isinstance(a, types.CodeType) and isinstance(b, types.CodeType):
        return same_code(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple | frozenset):
        return len(a) == len(b) and all(
            _same_constant(x, y) for x, y in zip(sorted(a, key=repr) if isinstance(
                a, frozenset) else a, sorted(b, key=repr) if isinstance(b, frozenset) else b,
                strict=True)
        )
    return bool(a == b) or (a != a and b != b)  # NaN constants are equal here


def same_code(a: types.CodeType, b: types.CodeType) -> bool:
    """Whether two code objects run the same instructions on the same constants and names."""
    return (
        a.co_code == b.co_code
        and a.co_names == b.co_names
        and a.co_varnames == b.co_varnames
        and a.co_freevars == b.co_freevars
        and a.co_cellvars == b.co_cellvars
        and a.co_argcount == b.co_argcount
        and a.co_kwonlyargcount == b.co_kwonlyargcount
        and a.co_posonlyargcount == b.co_posonlyargcount
        and len(a.co_consts) == len(b.co_consts)
        and all(_same_constant(x, y) for x, y in zip(a.co_consts, b.co_consts, strict=True))
    )


def _code_objects(code: types.CodeType) -> list[types.CodeType]:
    found = [code]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found += _code_objects(const)
    return found


def runs_this_source(fn: types.FunctionType) -> bool:
    """Whether the file ``fn`` came from, as it reads now, compiles to ``fn``'s running code.

    The whole file is compiled, not the function alone: how a call compiles depends on the
    module around it (CPython 3.11+ compiles ``mod.f()`` differently when ``mod`` is bound by
    an import statement of the module).
    """
    code = fn.__code__
    lines = linecache.getlines(code.co_filename, fn.__globals__)
    if not lines:
        return False
    try:
        module = compile("".join(lines), code.co_filename, "exec",
                         flags=code.co_flags & _FUTURE_FLAGS, dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    qualname = getattr(code, "co_qualname", None)
    return any(
        c.co_name == code.co_name and getattr(c, "co_qualname", None) == qualname
        and same_code(c, code)
        for c in _code_objects(module)
    )
