"""What a ``RemoteSource`` opens in one process for an fsspec protocol: the filesystem on an
asyncio loop thread of its own, set up for stoker's retries and with timeouts on every
request, and how all of it is closed: by ``RemoteSource.close()``, or when the source is
garbage collected.

NOTE [ S3 clients after fork ]
Creating an S3 client parses botocore's JSON service models: ~70 ms of CPU in each worker,
on the way to its first batch. The models, once parsed, are plain data in botocore's data
loader, which holds no lock or connection; every S3 session of a process is given the same
loader (``_BOTOCORE_DATA``), so a forked worker inherits its parent's parsed models and
creates its client in ~10 ms. Sessions themselves (credentials, with their locks) and clients
stay per process.

NOTE [ A source dropped without close ]
Datasets get rebuilt (validation rounds, sweeps) and are rarely closed: a handle closed only by
``close()`` left its loop thread, the loop's executor thread and the loop's 3 fds behind for
each source dropped (20 dropped datasets: 40 threads, 60 fds), and s3fs's own finalizer closed
the session on whatever loop the collecting thread ran ("attached to a different loop").
So an opened handle is tied to its source by ``weakref.finalize`` (holding the handle, never
the source): when the source is collected, the finalizer schedules the shutdown on the
handle's own loop (session closed, default executor shut down, loop stopped) and returns; the
loop thread then closes the loop and drops the filesystem, with no loop running for the
filesystem's own finalizers to schedule on. Scheduling never blocks, so it is safe in a GC
callback on any thread, the loop thread included. ``close()`` runs the same finalizer, then
waits for the thread. Only in the process that opened the handle: a forked child holds a copy
of its parent's (NOTE [ Remote handles after fork ] in ``remote.py``).

NOTE [ Requests that never answer ]
aiohttp's default limit is 300 s for a whole request, and gcsfs passes none at all, so a server
that accepts the connection and never answers (a half-open connection, a stuck proxy) held
each attempt ~5 min over http(s):// and for ever over gs://. Unless ``storage_options`` set
their own (``client_kwargs={"timeout": aiohttp.ClientTimeout(...)}`` for http(s),
``requests_timeout`` for gcsfs), requests get ``_CONNECT_TIMEOUT_S`` to connect and
``_READ_TIMEOUT_S`` between two reads of the socket, and no limit on the whole request (a big
shard on a slow link takes what it takes while bytes keep coming). The values are s3fs's
defaults (its botocore connect and read timeouts): a stalled store is reported and retried
alike over every protocol, and a working store sends its first byte well within 15 s.
"""

from __future__ import annotations

import asyncio
import os
import threading
import types
import weakref
from dataclasses import dataclass
from typing import Any

_BOTOCORE_DATA: list[Any] = []  # NOTE [ S3 clients after fork ]: the process's data loader
_CONNECT_TIMEOUT_S = 5.0  # NOTE [ Requests that never answer ]
_READ_TIMEOUT_S = 15.0
_CLOSE_WAIT_S = 10.0  # close() waits this long for the loop thread


@dataclass
class Handle:
    """What one process opened: the filesystem, its loop and loop thread (None for a
    synchronous one), and the finalizer that shuts them down."""

    pid: int
    fs: Any
    loop: asyncio.AbstractEventLoop | None = None
    thread: threading.Thread | None = None
    release: weakref.finalize | None = None


def open_filesystem(owner: object, protocol: str, options: dict[str, Any]) -> Handle:
    """This process's ``protocol`` filesystem from ``storage_options``, shut down when
    ``owner`` is collected unless ``close_handle`` did it first."""
    import fsspec
    from fsspec.asyn import AsyncFileSystem

    options = with_default_timeouts(protocol, options)
    if protocol in ("s3", "s3a") and "config_kwargs" not in options:
        options["config_kwargs"] = {"retries": {"total_max_attempts": 1}}  # ours retry
    if not issubclass(fsspec.get_filesystem_class(protocol), AsyncFileSystem):
        return Handle(os.getpid(), fsspec.filesystem(protocol, **options))
    handle = Handle(os.getpid(), None, asyncio.new_event_loop())
    handle.thread = threading.Thread(target=_serve, args=(handle,), name="stoker-remote-io",
                                     daemon=True)
    handle.thread.start()
    handle.release = weakref.finalize(owner, _release, handle)
    handle.release.atexit = False  # at exit the daemon thread just ends
    try:
        fs = fsspec.filesystem(protocol, skip_instance_cache=True, loop=handle.loop, **options)
    except BaseException:
        close_handle(handle)
        raise
    if protocol in ("s3", "s3a") and "session" not in options:
        _share_botocore_data(fs)
    if hasattr(fs, "retries"):
        fs.retries = 1  # s3fs retries on its own; one policy decides (ours)
    if protocol in ("gs", "gcs"):
        _without_gcsfs_retries(fs)
    handle.fs = fs
    return handle


def close_handle(handle: Handle) -> None:
    """Shut the handle's loop down now and wait for its thread (NOTE [ A source dropped
    without close ])."""
    if handle.release is not None:
        handle.release()  # once: a later collection of the source does nothing
    if handle.thread is not None and handle.thread is not threading.current_thread():
        handle.thread.join(timeout=_CLOSE_WAIT_S)


def with_default_timeouts(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with NOTE [ Requests that never answer ]'s timeouts where they set none."""
    options = dict(options)
    if protocol not in ("http", "https", "gs", "gcs"):
        return options
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_TIMEOUT_S,
                                    sock_read=_READ_TIMEOUT_S)
    if protocol in ("gs", "gcs"):  # gcsfs gives each request its own (None: no limit)
        if options.get("requests_timeout") is None:
            options["requests_timeout"] = timeout
    else:
        client_kwargs = dict(options.get("client_kwargs") or {})
        client_kwargs.setdefault("timeout", timeout)
        options["client_kwargs"] = client_kwargs
    return options


def _serve(handle: Handle) -> None:
    """The loop thread: runs the loop until ``_shut_down`` stops it, then closes it. The
    filesystem goes with the handle after this returns: no loop runs then."""
    assert handle.loop is not None
    handle.loop.run_forever()
    handle.loop.close()


def _release(handle: Handle) -> None:
    """The finalizer: schedules ``_shut_down`` on the handle's loop, never blocking."""
    loop = handle.loop
    if handle.pid != os.getpid() or loop is None or loop.is_closed():
        return  # a parent's handle, copied by fork: left alone
    shutdown = _shut_down(handle)
    try:
        asyncio.run_coroutine_threadsafe(shutdown, loop)
    except RuntimeError:  # closed meanwhile
        shutdown.close()


async def _shut_down(handle: Handle) -> None:
    assert handle.loop is not None
    await _close_session(handle.fs, handle.loop)
    await handle.loop.shutdown_default_executor()
    handle.loop.stop()


async def _close_session(fs: Any, loop: asyncio.AbstractEventLoop) -> None:
    close_session = getattr(type(fs), "close_session", None)
    session = getattr(fs, "_s3", None) or getattr(fs, "_session", None)
    if close_session is None or session is None:
        return
    try:
        if asyncio.iscoroutinefunction(getattr(session, "close", None)):
            # Awaited on its loop: gcsfs's close_session only schedules the close, which the
            # loop stopped just after would destroy pending.
            await asyncio.wait_for(session.close(), 5)
        else:
            close_session(loop, session)
    except Exception:  # a session that never connected; nothing to close
        pass


def _share_botocore_data(fs: Any) -> None:
    """Give the S3 filesystem a session of its own that parses service models into the
    process's shared data loader (NOTE [ S3 clients after fork ])."""
    try:
        from aiobotocore.session import AioSession
    except ImportError:  # an s3fs not built on aiobotocore: leave it as it is
        return
    session = AioSession(**getattr(fs, "kwargs", {}))  # what s3fs would create
    if _BOTOCORE_DATA:
        session.register_component("data_loader", _BOTOCORE_DATA[0])
    else:
        _BOTOCORE_DATA.append(session.get_component("data_loader"))
    fs.session = session


def _without_gcsfs_retries(fs: Any) -> None:
    """Make each gcsfs request once: its ``retry_request`` decorator retries up to 6 times,
    sleeping 1-2 s, then 2-3 s, ... between, a count fixed when the class is defined (setting
    ``fs.retries`` changes nothing), under our own policy: a persistent 503 took 102 s and 18
    GETs to report instead of 3 GETs, and a transient one waited 1.5 s whatever the
    ``RetryPolicy``. The undecorated request, on this instance only."""
    raw = getattr(getattr(type(fs), "_request", None), "__wrapped__", None)
    if raw is not None:
        fs._request = types.MethodType(raw, fs)
