"""Whether code is torch's own: the function torch's module defines under that name.

NOTE [ torch's own functions ]
A fast path may replace torch's code only where that code is torch's: a program can rebind a
module's function (``torch.utils.data._utils.collate.default_collate = mine``) or a class's
method (``RandomSampler.__iter__ = mine``), and torch then calls the program's version. An
identity check against a reference taken at import misses a rebinding made before stoker was
imported, and ``__module__``/``__qualname__`` are what ``functools.wraps`` copies onto a
wrapper. The code object is not: torch's function has its code in that module's file, under
that name, and a program's wrapper has its own. torch's C functions have no code object: a
``torch.<name>`` is torch's while it is ``torch._C._VariableFunctions.<name>``, and a
``torch.Tensor`` method defined in C (on ``TensorBase``, which cannot be changed) is torch's
while ``torch.Tensor``'s own dict does not shadow it.

The other way round, a fast path's own calls (an ``index_select`` where torch's path has
``torch.stack``) go to torch's C function or method itself (``c_function``, ``c_method``): a
program that rebound ``torch.index_select`` or patched ``torch.Tensor.index_copy_`` sees no
call torch's path would not make.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
import torch._tensor

__all__ = ["c_function", "c_method", "methods_own", "tensor_methods_own", "torch_function_own",
           "torchs_own"]


def torchs_own(fn: Any, module: ModuleType, name: str) -> bool:
    """``fn`` (a function, or a property's getter) is the ``name`` torch's ``module`` defines."""
    if isinstance(fn, property):
        fn = fn.fget
    fn = getattr(fn, "__func__", fn)  # a classmethod or staticmethod read from the class dict
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_name == name and code.co_filename == module.__file__


def methods_own(cls: type, module: ModuleType, names: tuple[str, ...]) -> bool:
    """Each of ``names`` on torch's class ``cls`` is the one ``module`` defines for it."""
    return all(torchs_own(getattr(cls, name, None), module, name) for name in names)


def tensor_methods_own(names: tuple[str, ...]) -> bool:
    """Each of ``names`` on ``torch.Tensor`` is torch's: its C method (nothing in
    ``torch.Tensor``'s own dict over it) or the one ``torch._tensor`` defines."""
    own = vars(torch.Tensor)
    return all(name not in own or torchs_own(own[name], torch._tensor, name) for name in names)


def torch_function_own(name: str) -> bool:
    """``torch.<name>`` is torch's C function of that name."""
    return getattr(torch, name, None) is getattr(torch._C._VariableFunctions, name)


def c_function(name: str) -> Any:
    """torch's C function ``torch.<name>``, whatever ``torch.<name>`` is bound to now."""
    return getattr(torch._C._VariableFunctions, name)


def c_method(name: str) -> Any:
    """torch's C method ``Tensor.<name>`` (on ``TensorBase``), whatever a program patched."""
    return getattr(torch._C.TensorBase, name)
