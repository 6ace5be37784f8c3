"""The written contracts hold: every ``stoker_*`` hook stoker reads on a dataset is declared by a
protocol of ``stoker._core.dataset_hooks`` (NOTE [ Dataset hooks ]) and read through it, and
every member a format reader uses on its byte source is declared by ``ByteSource`` or
``ByteSourceExtras`` (NOTE [ Optional source members ]). The source is scanned with ``ast``, so
a probe that mypy cannot see (``getattr`` with a string, an untyped ``source``) counts too."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import stoker
from stoker._core import dataset_hooks
from stoker._core.dataset_hooks import (
    HOOKS,
    SupportsEpoch,
    SupportsPrepareBatch,
    SupportsShareLists,
    SupportsThreadSafe,
    declares,
    flag,
    hook_name,
    provided,
)
from stoker.storage import ByteSource, LocalSource, RemoteSource
from stoker.storage.source import ByteSourceExtras, extra, extra_value, offers

ROOT = Path(stoker.__file__).parent
HOOKS_MODULE = ROOT / "_core" / "dataset_hooks.py"
DECLARED_HOOKS = {hook_name(protocol): protocol for protocol in HOOKS}
_PROBES = {"getattr", "hasattr", "setattr", "delattr", "getattr_static"}
_HOOK = re.compile(r"stoker_[a-z_]+\Z")


def _members(protocol: type) -> set[str]:
    """What a protocol declares: its methods, properties and annotated attributes."""
    own = {n for n in vars(protocol) if not n.startswith("_")}
    return own | set(vars(protocol).get("__annotations__", {}))


def _modules(under: Path) -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(ROOT)), ast.parse(p.read_text(), str(p)))
            for p in sorted(under.rglob("*.py"))]


def _probe_name(call: ast.Call) -> str | None:
    """The attribute name a ``getattr``-like call asks for, when it is a string literal."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(
        func, ast.Attribute) else None
    if name in _PROBES and len(call.args) >= 2:
        arg = call.args[1]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
    return None


def _hook_uses(tree: ast.Module) -> list[tuple[int, str, str]]:
    """(line, how, name) of every ``stoker_*`` name read, probed, defined or set on an object:
    attribute accesses, ``getattr``-like probes with a literal, methods and class attributes."""
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _HOOK.match(node.attr):
            found.append((node.lineno, "attribute", node.attr))
        elif isinstance(node, ast.Call) and (name := _probe_name(node)) and _HOOK.match(name):
            found.append((node.lineno, "probe", name))
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                targets: list[Any] = (
                    [item] if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                    else item.targets if isinstance(item, ast.Assign)
                    else [item.target] if isinstance(item, ast.AnnAssign) else [])
                for target in targets:
                    name = getattr(target, "name", None) or getattr(target, "id", None)
                    if name and _HOOK.match(name):
                        found.append((item.lineno, "defined", name))
    return found


# -------------------------------------------------------------------------------- dataset hooks


def test_every_stoker_hook_used_in_src_is_declared_by_a_protocol() -> None:
    undeclared = [f"{rel}:{line}: {how} {name}" for rel, tree in _modules(ROOT)
                  for line, how, name in _hook_uses(tree) if name not in DECLARED_HOOKS]
    assert not undeclared, (
        "stoker_* names used on objects that no protocol of stoker._core.dataset_hooks "
        "declares (add a Supports... protocol there, with what stoker does and what the "
        "dataset promises):\n" + "\n".join(undeclared))


def test_hooks_are_probed_only_through_the_hooks_module() -> None:
    """NOTE [ Dataset hooks ]: the names live in one place; probes use ``declares``/``flag``/
    ``provided``, never a string of their own."""
    literal = [f"{rel}:{line}: {name}" for rel, tree in _modules(ROOT)
               if rel != str(HOOKS_MODULE.relative_to(ROOT))
               for line, how, name in _hook_uses(tree) if how == "probe"]
    assert not literal, ("getattr-like probes of stoker_* hooks by a string (use "
                         "stoker._core.dataset_hooks.declares / flag / provided):\n"
                         + "\n".join(literal))


def test_every_hook_is_read_somewhere() -> None:
    """A protocol whose hook stoker no longer reads would promise users something untrue."""
    source = "\n".join(p.read_text() for p in ROOT.rglob("*.py") if p != HOOKS_MODULE)
    unread = [p.__name__ for p in HOOKS if not re.search(rf"\b{p.__name__}\b", source)]
    assert not unread, f"hook protocols stoker never reads: {unread}"


def test_one_hook_per_protocol_named_after_it() -> None:
    for protocol in HOOKS:
        assert _members(protocol) == {hook_name(protocol)}, protocol
        camel = "".join(w.title() for w in hook_name(protocol).split("_")[1:])
        assert protocol.__name__ == f"Supports{camel}"
        assert protocol.__doc__ and protocol.__module__ == dataset_hooks.__name__
    assert sorted(DECLARED_HOOKS) == [
        "stoker_epoch", "stoker_fetch_for_batch", "stoker_fetch_for_stream",
        "stoker_prepare_batch", "stoker_share_lists", "stoker_tensor_index",
        "stoker_thread_safe"]


def test_hook_protocols_are_public() -> None:
    for protocol in HOOKS:
        assert getattr(stoker, protocol.__name__) is protocol
        assert protocol.__name__ in stoker.__all__


def test_implementations_in_stoker_match_their_protocols() -> None:
    from stoker.formats import TarShards, TarShardStream

    for cls in (TarShards, TarShardStream):
        for name in {n for n in vars(cls) if n in DECLARED_HOOKS}:
            declared = getattr(DECLARED_HOOKS[name], name)
            assert (list(inspect.signature(getattr(cls, name)).parameters)
                    == list(inspect.signature(declared).parameters)), f"{cls.__name__}.{name}"


class _Flagged:
    stoker_thread_safe = True
    stoker_share_lists = False


def test_probes_read_the_attribute_as_getattr_does() -> None:
    """The semantics the probe sites had: class or instance attribute alike; a flag counts only
    when it is True (1 is not); a method hook set to None is not provided."""
    assert declares(_Flagged(), SupportsThreadSafe) and declares(_Flagged, SupportsThreadSafe)
    own = _Flagged()
    own.stoker_thread_safe = 1  # type: ignore[assignment]
    assert not declares(own, SupportsThreadSafe)
    assert flag(_Flagged(), SupportsShareLists) is False
    assert flag(object(), SupportsShareLists) is None

    class Hooked:
        def stoker_prepare_batch(self, indices: list[int]) -> None:
            self.seen = indices

    ds = Hooked()
    prepare = provided(ds, SupportsPrepareBatch.stoker_prepare_batch)
    assert prepare is not None
    prepare([1, 2])
    assert ds.seen == [1, 2]
    ds.stoker_prepare_batch = None  # type: ignore[assignment,method-assign]
    assert provided(ds, SupportsPrepareBatch.stoker_prepare_batch) is None
    assert provided(object(), SupportsEpoch.stoker_epoch) is None


# -------------------------------------------------------------------------------- byte sources

SOURCE_MEMBERS = _members(ByteSource) | _members(ByteSourceExtras)
# Modules of stoker.formats whose ``source`` is something else: what ``pack`` packs (a folder or
# a dataset), and its report's record of it.
_NOT_BYTE_SOURCES = {"formats/pack.py", "formats/pack_report.py", "formats/_records.py"}


def _is_source(node: ast.expr) -> bool:
    """``source``, ``self.source`` or ``self._source`` (what the readers call their source)."""
    return (isinstance(node, ast.Name) and node.id == "source") or (
        isinstance(node, ast.Attribute) and node.attr in ("source", "_source"))


def _source_uses(tree: ast.Module) -> list[tuple[int, str, str]]:
    """(line, how, name) of every member used on a reader's source."""
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_source(node.value):
            found.append((node.lineno, "attribute", node.attr))
        elif isinstance(node, ast.Call):
            name = _probe_name(node)
            if name is not None and node.args and _is_source(node.args[0]):
                found.append((node.lineno, "probe", name))
            func = node.func
            if isinstance(func, ast.Name) and func.id in ("extra", "extra_value", "offers"):
                member = node.args[1] if len(node.args) > 1 else None
                if isinstance(member, ast.Attribute):
                    found.append((node.lineno, "extra", member.attr))
    return found


def _reader_modules() -> list[tuple[str, ast.Module]]:
    return [(rel, tree) for rel, tree in _modules(ROOT / "formats")
            if rel not in _NOT_BYTE_SOURCES]


def test_readers_use_only_what_the_byte_source_protocols_declare() -> None:
    undeclared = [f"{rel}:{line}: {how} {name}" for rel, tree in _reader_modules()
                  for line, how, name in _source_uses(tree) if name not in SOURCE_MEMBERS]
    assert not undeclared, (
        "members used on a byte source that neither ByteSource nor ByteSourceExtras "
        "(stoker/storage/source.py) declares:\n" + "\n".join(undeclared))


def test_readers_ask_for_optional_members_through_the_protocol() -> None:
    """NOTE [ Optional source members ]: ``extra``/``extra_value``/``offers``, not a string."""
    literal = [f"{rel}:{line}: {name}" for rel, tree in _reader_modules()
               for line, how, name in _source_uses(tree) if how == "probe"]
    direct = [f"{rel}:{line}: {name}" for rel, tree in _reader_modules()
              for line, how, name in _source_uses(tree)
              if how == "attribute" and name in _members(ByteSourceExtras)]
    assert not literal and not direct, (
        f"optional source members probed by a string: {literal}; called as if every "
        f"source had them: {direct}")


def test_the_scan_sees_the_readers_calls() -> None:
    """The scan above finds what it looks for (a guard against it silently finding nothing)."""
    used = {name for _, tree in _reader_modules() for _, _, name in _source_uses(tree)}
    assert {"read", "read_range", "size", "local_path"} <= used
    assert {"get_whole", "fetch_for_workers", "cache", "lookahead_shards"} <= used


def _parameters(fn: Any) -> list[str]:
    target = getattr(fn, "fget", fn)
    return list(inspect.signature(target).parameters)


def test_remote_source_offers_every_extra_and_local_source_the_core() -> None:
    for name in _members(ByteSource):
        assert _parameters(getattr(LocalSource, name)) == _parameters(getattr(ByteSource, name))
        assert _parameters(getattr(RemoteSource, name)) == _parameters(getattr(ByteSource, name))
    source = RemoteSource("memory")
    for name in _members(ByteSourceExtras):
        declared = vars(ByteSourceExtras)[name]
        if isinstance(declared, property):
            assert hasattr(source, name), name
        else:
            assert _parameters(getattr(RemoteSource, name)) == _parameters(declared), name
    assert not any(hasattr(LocalSource(), name) for name in _members(ByteSourceExtras))


def test_extras_are_read_as_getattr_does() -> None:
    source = RemoteSource("memory", lookahead_shards=5)
    assert extra(source, ByteSourceExtras.known_size) == source.known_size
    assert extra_value(source, ByteSourceExtras.lookahead_shards, 0) == 5
    assert extra_value(source, ByteSourceExtras.cache, None) is None  # it has none: its value
    assert offers(source, ByteSourceExtras.expect_sizes)
    local = LocalSource()
    assert extra(local, ByteSourceExtras.get_whole) is None
    assert extra_value(local, ByteSourceExtras.lookahead_shards, 0) == 0
    assert not offers(local, ByteSourceExtras.expect_sizes)


@pytest.mark.parametrize("protocol", [ByteSource, ByteSourceExtras])
def test_byte_source_members_have_docstrings(protocol: type) -> None:
    for name in _members(protocol):
        member = vars(protocol)[name]
        assert (getattr(member, "fget", member).__doc__ or "").strip(), f"{protocol}.{name}"
