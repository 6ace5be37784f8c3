"""Integration-test fixtures: the leak check that runs around every integration test.

Before each test it records child processes (recursive), live Python threads, open file
descriptors (with their ``readlink`` targets) and ``/dev/shm`` entries. After the test it polls
(collecting garbage once anything is left) until all of them are back to that baseline or a
deadline passes, then fails naming whatever is left: pid and cmdline, thread names, fd targets
(memfd segments show as ``/memfd:...``), shared-memory names. Anything a loader leaves behind is
a bug.

Not counted as leaks: the stdlib's process-wide singletons that start lazily and live for the
rest of the session (``multiprocessing``'s resource tracker and forkserver, with the fd the
parent keeps to each); ``/dev/shm`` entries held open or mapped only by processes outside this
test's process tree (another test run on the same machine); and named semaphores (``sem.*``)
that no process maps any more, which cannot be attributed (a live SemLock of ours maps its
semaphore; an orphaned one is unlinked by its creator's resource tracker).
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import pytest

# The helper datasets are imported as the top-level module ``_datasets`` (so that spawned and
# forkserver workers, which get this sys.path, can unpickle them), whatever the rootdir layout.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

LEAK_DEADLINE_S = 10.0
POLL_INTERVAL_S = 0.02
GC_EVERY_S = 0.5
SHM_DIR = "/dev/shm"
_SINGLETON_MARKERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


@dataclass(frozen=True)
class Snapshot:
    children: dict[tuple[int, float], str]  # (pid, create_time) -> description
    threads: dict[int, str]  # id(thread) -> description
    fds: dict[int, str]  # fd -> readlink target
    shm: frozenset[str]


def _describe_process(proc: psutil.Process) -> str:
    try:
        with proc.oneshot():
            status = proc.status()
            cmdline = " ".join(proc.cmdline()) or f"[{proc.name()}]"
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        status, cmdline = "gone/zombie", "?"
    if len(cmdline) > 300:
        cmdline = cmdline[:300] + "..."
    return f"pid {proc.pid} ({status}): {cmdline}"


def _children() -> dict[tuple[int, float], str]:
    out: dict[tuple[int, float], str] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            key = (proc.pid, proc.create_time())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            key = (proc.pid, 0.0)
        out[key] = _describe_process(proc)
    return out


def _threads() -> dict[int, str]:
    return {
        id(t): f"{t.name!r} (ident {t.ident}, daemon={t.daemon}, {type(t).__name__})"
        for t in threading.enumerate()
    }


def _fds() -> dict[int, str]:
    fd_dir = f"/proc/{os.getpid()}/fd"
    out: dict[int, str] = {}
    for name in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:  # closed between listdir and readlink (the listing's own fd, races)
            continue
        if target.startswith(fd_dir) or target.startswith("/proc/self/fd"):
            continue
        out[int(name)] = target
    return out


def _shm() -> frozenset[str]:
    try:
        return frozenset(os.listdir(SHM_DIR))
    except FileNotFoundError:
        return frozenset()


def snapshot() -> Snapshot:
    return Snapshot(children=_children(), threads=_threads(), fds=_fds(), shm=_shm())


def _singleton_fds() -> set[int]:
    """Fds the parent keeps open to the stdlib's lazily started singleton helper processes."""
    fds: set[int] = set()
    import multiprocessing.resource_tracker as rt

    fd = getattr(rt._resource_tracker, "_fd", None)
    if isinstance(fd, int):
        fds.add(fd)
    fs_mod = sys.modules.get("multiprocessing.forkserver")
    if fs_mod is not None:
        fd = getattr(fs_mod._forkserver, "_forkserver_alive_fd", None)
        if isinstance(fd, int):
            fds.add(fd)
    return fds


def _shm_held(
    names: set[str], only: set[int] | None = None, exclude: set[int] | None = None
) -> set[str]:
    """The entries of ``names`` that a process (in ``only``, or not in ``exclude``) has open
    or mapped."""
    held: set[str] = set()
    if not names:
        return held
    paths = {os.path.join(SHM_DIR, n): n for n in names}
    pids = only if only is not None else {int(p) for p in os.listdir("/proc") if p.isdigit()}
    for pid in pids - (exclude or set()):
        base = f"/proc/{pid}"
        try:
            with open(f"{base}/maps") as fh:
                for line in fh:
                    path = line.rstrip("\n").split(maxsplit=5)[-1].removesuffix(" (deleted)")
                    if path in paths:
                        held.add(paths[path])
            for fd in os.listdir(f"{base}/fd"):
                try:
                    target = os.readlink(f"{base}/fd/{fd}").removesuffix(" (deleted)")
                except OSError:
                    continue
                if target in paths:
                    held.add(paths[target])
        except OSError:
            continue
    return held


def leftovers(before: Snapshot, final: bool = False) -> list[str]:
    """What exists now that did not at ``before``; empty when back to the baseline.

    ``final`` also scans ``/proc`` to drop new ``/dev/shm`` entries that belong to processes
    outside this test's tree (too slow to do on every poll).
    """
    problems: list[str] = []
    now_children = _children()
    for key, desc in now_children.items():
        if key in before.children or any(m in desc for m in _SINGLETON_MARKERS):
            continue
        problems.append(f"child process {desc}")
    now_threads = _threads()
    for key, desc in now_threads.items():
        if key not in before.threads:
            problems.append(f"thread {desc}")
    singleton_fds = _singleton_fds()
    for fd, target in _fds().items():
        if before.fds.get(fd) == target or fd in singleton_fds:
            continue
        problems.append(f"fd {fd} -> {target}")
    new_shm = set(_shm() - before.shm)
    if new_shm and final:
        own = {os.getpid()} | {pid for pid, _ in now_children}
        held_by_own = _shm_held(new_shm, only=own)
        held_by_others = _shm_held(new_shm - held_by_own, exclude=own)
        # A named semaphore nobody maps any more cannot be attributed: its creator's resource
        # tracker unlinks it (one of ours would still be mapped here while its SemLock lives).
        unheld_semaphores = {n for n in new_shm - held_by_own if n.startswith("sem.")}
        new_shm -= held_by_others | unheld_semaphores
    problems.extend(f"/dev/shm entry {name}" for name in sorted(new_shm))
    return problems


def wait_for_baseline(before: Snapshot, deadline_s: float = LEAK_DEADLINE_S) -> list[str]:
    """Poll every 20 ms until nothing is left over; return what still is at the deadline.

    A full ``gc.collect()`` costs ~0.1 s with torch loaded, so it runs only once something is
    left over (a loader caught in a reference cycle), and then every 0.5 s.
    """
    start = time.monotonic()
    last_gc: float | None = None
    while True:
        now = time.monotonic()
        thorough = last_gc is not None and now - last_gc >= GC_EVERY_S
        if thorough:
            gc.collect()
            last_gc = now
        left = leftovers(before, final=thorough)
        if not left:
            return []
        if last_gc is None:
            gc.collect()
            last_gc = time.monotonic()
            continue
        if now - start >= deadline_s:
            gc.collect()
            return leftovers(before, final=True)
        time.sleep(POLL_INTERVAL_S)


@pytest.fixture(scope="session", autouse=True)
def obstore_runtime() -> None:
    """obstore's runtime (its threads, epoll and event fds) starts on a process's first
    request and lives as long as the process, like the stdlib's helper processes; obstore is
    the default S3 client where installed (NOTE [ The client by default ]), so whichever test
    reads S3 first would seem to leak it: it is started here, before any leak baseline."""
    try:
        import obstore
        from obstore.store import MemoryStore
    except ImportError:
        return
    store = MemoryStore()
    obstore.put(store, "warm", b"x")
    assert bytes(obstore.get(store, "warm").bytes()) == b"x"


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[Snapshot]:
    """Fail the test if it leaves processes, threads, fds or shared memory behind."""
    before = snapshot()
    yield before
    report = getattr(request.node, "stoker_report_call", None)
    if report is not None and report.failed:
        # The failure's traceback keeps the test's frames (and any loader in them) alive, so a
        # leak check now would only repeat the failure. Leftovers join the next test's baseline.
        return
    left = wait_for_baseline(before)
    if left:
        pytest.fail(
            f"{request.node.nodeid} left {len(left)} resource(s) behind "
            f"{LEAK_DEADLINE_S:.0f} s after it ended:\n  " + "\n  ".join(left),
            pytrace=False,
        )


@pytest.fixture
def leak_tools() -> Any:
    """This module's snapshot/leftovers/wait_for_baseline, for the leak check's own tests."""
    return types.SimpleNamespace(
        snapshot=snapshot, leftovers=leftovers, wait_for_baseline=wait_for_baseline
    )
