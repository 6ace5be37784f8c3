"""Warnings torch's DataLoader gives, given as torch gives them (issue 44).

NOTE [ torch's voice ]
With default arguments, on a run that succeeds, stoker issues through ``warnings`` exactly
what torch 2.13's DataLoader issues there, and nothing else: the same category and text, as
many times, at the same moment, and *attributed as torch attributes them*: the ``filename``
and ``lineno`` of the frame torch's ``warnings.warn(..., stacklevel=2)`` lands in, the module
name that ``warnings.filterwarnings(module=...)`` matches, and that module's
``__warningregistry__``, so the default once-per-location filter is shared with torch's own
warnings (a warning torch's loader gave at that place is not given again by stoker's, and the
other way round). torch's
sites and what stoker does for each (the audit in docs/same_as_torch.md):

* from a method of the loader (``check_worker_number_rationality``, called by torch's
  ``DataLoader.__init__`` and ``_get_iterator``): stoker's ``DataLoader.__init__`` runs
  torch's, so that call is torch's own; for ``_get_iterator`` stoker calls torch's method
  through ``call_as_torch`` from a frame that stands at torch's call, so torch's own
  ``warnings.warn`` attributes it there (text, line, module, registry by construction).
* from ``_BaseDataLoaderIter.__init__`` (``pin_memory`` without an accelerator,
  ``pin_memory_device`` deprecated, MPS): ``warn_as_torch`` gives stoker's copy of the text with
  ``warnings.warn_explicit`` at the line of ``super().__init__(loader)`` in torch's
  single-process or worker iterator, whichever torch would have made.
* from ``_BaseDataLoaderIter.__next__`` (an IterableDataset longer than its ``__len__``):
  torch's ``stacklevel=2`` lands in the code that called ``next()`` (the user's loop), so
  ``warn_at_caller`` attributes it to the first frame outside stoker.

torch's lines are read from torch's own code (the bytecode of the function that makes the
call, once, when first needed), never written down here: another torch release moves
them. stoker's own advice (generators every worker copies, copy-on-read growth, stalls) is
not torch's and goes to ``logging`` and ``loader.stats().advice`` instead, never through
``warnings`` (NOTE [ Same as torch unless asked ]). Warnings stay warnings only on failure
paths and in stoker's own APIs (resume, ``on_error="skip"``, ``TarShards``, the cache, the
Accelerate integration), each with its reason in docs/same_as_torch.md.

NOTE [ Advice is quiet ]
Nor does stoker's advice print anything on a run that succeeds: torch's DataLoader writes
nothing to stderr there, and a WARNING record on a logger with no handler reaches stderr
through ``logging.lastResort``. So advice about a run that works (a generator every worker
copies, copy-on-read memory growth, a dataset batched as gathers) is logged at
``ADVICE_LEVEL`` (DEBUG), which neither an unconfigured program nor the usual
``logging.basicConfig(level=logging.INFO)`` shows; it is kept in ``loader.stats().advice``,
and the doctor prints it. Only what foretells a failure stays loud: the stall report (no batch
for ``stall_warning_s``, default 300 s, where torch hangs silently) is a WARNING, and so are
messages of stoker's own opt-in APIs (``on_error="skip"``, ``device=``).
"""

from __future__ import annotations

import dis
import functools
import importlib
import linecache
import logging
import os
import sys
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ADVICE_LEVEL = logging.DEBUG  # NOTE [ Advice is quiet ]

_STOKER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


@dataclass(frozen=True)
class TorchSite:
    """Where in torch's ``module`` (``torch/utils/data/dataloader.py`` unless named) a warning
    is attributed: the call to ``call`` (a method or function name) inside ``owner.function``
    (``function`` alone where ``owner`` is "": a module-level function), on the
    ``occurrence``-th line that calls it there."""

    owner: str
    function: str
    call: str
    module: str = "torch.utils.data.dataloader"
    occurrence: int = 1


# The frame torch's ``warnings.warn(..., stacklevel=2)`` lands in, for each of its sites.
WORKER_COUNT_AT_ITER = TorchSite("DataLoader", "_get_iterator", "check_worker_number_rationality")
PIN_SINGLE_PROCESS = TorchSite("_SingleProcessDataLoaderIter", "__init__", "__init__")
PIN_WORKERS = TorchSite("_MultiProcessingDataLoaderIter", "__init__", "__init__")
PICKLE_ERROR_AT_START = TorchSite("DataLoader", "_get_iterator", "_MultiProcessingDataLoaderIter")
# torch's calls into the program's code (NOTE [ torch's fetchers call the dataset ])
FETCH_IN_MAIN = TorchSite("_SingleProcessDataLoaderIter", "_next_data", "fetch")
NEXT_INDEX = TorchSite("_BaseDataLoaderIter", "_next_index", "next")
# ``self._sampler_iter = iter(self._index_sampler)``: a new iterator's, then each ``_reset``'s
SAMPLER_ITER_AT_INIT = TorchSite("_BaseDataLoaderIter", "__init__", "iter")
SAMPLER_ITER_AT_RESET = TorchSite("_BaseDataLoaderIter", "_reset", "iter")
_WORKER = "torch.utils.data._utils.worker"
FETCH_IN_WORKER = TorchSite("", "_worker_loop", "fetch", _WORKER)
INIT_IN_WORKER = TorchSite("", "_worker_loop", "init_fn", _WORKER)
# a persistent worker's new epoch: ``fetcher = _DatasetKind.create_fetcher(`` in its loop
RENEW_FETCHER_IN_WORKER = TorchSite("", "_worker_loop", "create_fetcher", _WORKER, occurrence=2)
# ``at_torch_call``'s arguments for each call site, the same everywhere (one cached function)
FETCH_IN_MAIN_CALL = (FETCH_IN_MAIN, "self, index", "data")
NEXT_INDEX_CALL = (NEXT_INDEX, "self", "")
SAMPLER_ITER_AT_INIT_CALL = (SAMPLER_ITER_AT_INIT, "self", "self._sampler_iter")
SAMPLER_ITER_AT_RESET_CALL = (SAMPLER_ITER_AT_RESET, "self", "self._sampler_iter")
FETCH_IN_WORKER_CALL = (FETCH_IN_WORKER, "fetcher, index", "data")
INIT_IN_WORKER_CALL = (INIT_IN_WORKER, "init_fn, worker_id", "")
# torch's fetch line in a worker whose worker_init_fn raised: ``fetcher`` was never bound, and
# the line raises torch's UnboundLocalError (NOTE [ After worker_init_fn raised ])
FETCH_WITHOUT_FETCHER_CALL = (FETCH_IN_WORKER, "index", "data", "fetcher")


def _torch_module(site: TorchSite) -> types.ModuleType:
    return importlib.import_module(site.module)


def _function(site: TorchSite) -> types.FunctionType:
    module = _torch_module(site)
    owner = getattr(module, site.owner) if site.owner else module
    return getattr(owner, site.function)  # type: ignore[no-any-return]


@functools.cache
def call_line(site: TorchSite) -> int | None:
    """The line of ``site``'s call in torch's function: an instruction that loads the name
    ``call`` on a line of torch's source that calls it (``call(``), on the ``occurrence``-th
    such line; None when this torch has no such call there (another release) or no source.
    Read from the function's bytecode one instruction at a time, not by parsing its file: a
    worker that looks its sites up allocates next to nothing, so the garbage collector runs in
    it when it would under torch."""
    try:
        code = _function(site).__code__
    except AttributeError:
        return None
    path, line, found, counted = code.co_filename, None, 0, None
    for instruction in dis.get_instructions(code):
        positions = getattr(instruction, "positions", None)  # 3.11+; before, starts_line
        if positions is not None and positions.lineno is not None:
            line = positions.lineno
        elif type(instruction.starts_line) is int:
            line = instruction.starts_line
        if instruction.argval != site.call or not instruction.opname.startswith("LOAD_"):
            continue
        if line is not None and f"{site.call}(" in linecache.getline(path, line):
            if line != counted:  # no set: nothing the collector counts is allocated
                found, counted = found + 1, line
            if found == site.occurrence:
                return int(line)
    return None


def torch_line(site: TorchSite) -> int:
    """The line of ``site``'s call in torch's source; the function's first line when this
    torch has no such call there (another release: attributed near, never failing)."""
    found = call_line(site)
    return found if found is not None else int(_function(site).__code__.co_firstlineno)


def _filename(site: TorchSite) -> str:
    return str(_function(site).__code__.co_filename)


def warn_as_torch(message: str, site: TorchSite, category: type[Warning] = UserWarning) -> None:
    """Issue ``message`` as torch's ``warnings.warn(message, stacklevel=2)`` in the function
    ``site`` calls would: at ``site``'s line of torch's file, for torch's module, in torch's
    module's registry (made there if missing, as ``warnings.warn`` makes it)."""
    module_globals = vars(_torch_module(site))
    registry = module_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(
        message, category, _filename(site), torch_line(site),
        module=module_globals["__name__"], registry=registry, module_globals=module_globals,
    )


@functools.cache
def _trampoline(site: TorchSite) -> types.FunctionType:
    """``lambda fn: fn()`` whose frame stands at ``site``: torch's file, the line of the call
    there and torch's module globals (so its name and ``__warningregistry__``)."""
    compiled = compile("def _at(fn):\n    fn()\n", _filename(site), "exec")
    code = next(c for c in compiled.co_consts if isinstance(c, types.CodeType))
    code = code.replace(co_firstlineno=torch_line(site) - 1, co_name=site.function)
    return types.FunctionType(code, vars(_torch_module(site)), site.function)


@functools.cache
def at_torch_call(site: TorchSite, params: str, result: str = "",
                  unbound: str = "") -> Callable[..., Any] | None:
    """A function of ``params`` whose body is torch's own line at ``site``, copied from
    torch's source (its columns too, so a traceback's carets fall where they do under torch),
    returning ``result`` (what the line binds: a name, ``self.<attribute>``) if given: a
    frame of it is the frame torch's call runs in (file, line, function name, torch's module
    globals), to ``warnings`` and to tracebacks (NOTE [ torch's fetchers call the dataset ]).
    ``unbound`` names a local the line reads that is never bound (its read raises
    UnboundLocalError, as in torch's function where the name was not assigned). None where
    this torch has no such line: the caller then calls plainly."""
    line = call_line(site)
    if line is None or line < 2:
        return None
    text = linecache.getline(_filename(site), line).rstrip("\n")
    indent = text[:len(text) - len(text.lstrip())]
    body = f"{text}\n"
    if result:
        body += f"{indent}return {result}\n"
    if unbound:  # after the return: a local of the function, never assigned
        body += f"{indent}{unbound} = None\n"
    try:
        return _defined_at(site, line - 1, params, body)
    except SyntaxError:
        return None


@functools.cache
def at_torch_rebind(site: TorchSite, name: str) -> Callable[[list[Any]], Any] | None:
    """A function of ``box`` (``[new, old]``) whose frame stands at ``site``, a line of
    torch's that begins ``name = ``: it binds ``name`` to ``old``, then on torch's line (its
    columns too) to ``new``, which it returns. So where nothing else holds ``old``, it goes at
    torch's line in a frame of torch's function, and what it says going (a generator's
    "Exception ignored in" report, a ``finally`` that reads the stack) reads as under torch.
    None where this torch has no such line: the caller then binds plainly."""
    line = call_line(site)
    if line is None or line < 3:
        return None
    text = linecache.getline(_filename(site), line)
    indent = text[:len(text) - len(text.lstrip())]
    if not text.lstrip().startswith(f"{name} = "):
        return None
    bind = f"{indent}{name} = box.pop()\n"  # old, then on torch's line new
    return _defined_at(site, line - 2, "box", bind + bind + f"{indent}return {name}\n")


def _defined_at(site: TorchSite, def_line: int, params: str, body: str) -> types.FunctionType:
    """``def <site's function>(params): body``, compiled as if written at ``def_line`` of
    torch's file, with torch's module globals."""
    source = "\n" * (def_line - 1) + f"def {site.function}({params}):\n{body}"
    compiled = compile(source, _filename(site), "exec")
    code = next(c for c in compiled.co_consts if isinstance(c, types.CodeType))
    return types.FunctionType(code, vars(_torch_module(site)), site.function)


def call_as_torch(site: TorchSite, fn: Callable[[], object]) -> None:
    """Call ``fn()`` from a frame at ``site``: what torch's own method called there warns
    with ``stacklevel=2`` is attributed, filtered and registered as when torch calls it."""
    _trampoline(site)(fn)


def warn_at_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """Issue ``message`` from the first frame outside stoker (the code that called the
    iterator's ``__next__``), as torch's ``__next__`` does with ``stacklevel=2``."""
    warnings.warn(message, category, stacklevel=stacklevel_outside_stoker())


def stacklevel_outside_stoker() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` made by this function's caller that lands on
    the first frame outside the stoker package."""
    level, frame = 1, sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_STOKER_DIR):
        frame, level = frame.f_back, level + 1
    return level
