"""Datasets read from ``http://`` URLs (any web server or CDN: fsspec's HTTP filesystem over
aiohttp) from a real HTTP server with byte ranges: ``TarShards`` by whole shards through the
cache and by ranged reads, and ``TarShardStream`` over a pack, each equal to the local copy,
with each shard fetched once; a missing object is named; a server that never answers, or
that ignores byte ranges, is reported soon; a source dropped without ``close()`` leaves no
thread or fd behind."""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from _optional import skip_module_unless

skip_module_unless(
    ("aiohttp", "reading http:// needs aiohttp (remote extra)"),
)

from _http_server import HTTPFiles, _Handler  # noqa: E402
from _remote_datasets import LabelAndClient, epoch_samples  # noqa: E402
from test_tar_stream import Numbers, label  # noqa: E402

import stoker  # noqa: E402
from _polling import poll_until  # noqa: E402
from stoker.errors import ShardError  # noqa: E402
from stoker.formats import TarShards, TarShardStream, pack  # noqa: E402
from stoker.storage import RemoteReadError, RetryPolicy, open_source  # noqa: E402

FAST_RETRY = RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=0.05)


def _client_timeout(**bounds: float | None) -> Any:
    """``aiohttp.ClientTimeout(**bounds)``, imported here, not at collection (_optional.py)."""
    import aiohttp

    return aiohttp.ClientTimeout(**bounds)


@pytest.fixture
def served(tmp_path: Path):
    pack(Numbers(), str(tmp_path / "packed"), samples_per_shard=4, workers=1, progress=False)
    with HTTPFiles(str(tmp_path)) as server:
        yield server


def _labels(dataset: Any, **kwargs: Any) -> list[Any]:
    return epoch_samples(stoker.DataLoader(dataset, batch_size=5, num_workers=2, timeout=60,
                                           **kwargs))


@pytest.mark.parametrize("fetch", ["shard", "range"])
def test_tar_shards_over_http_equal_the_local_ones(served, tmp_path, fetch) -> None:
    url = f"{served.url}/packed/index.json"
    cache = {"cache_dir": str(tmp_path / "cache"), "cache_bytes": 10**7} if fetch == "shard" \
        else {}
    source = open_source(url, retry=FAST_RETRY, fetch=fetch, **cache)
    remote = TarShards(url, source=source, transform=LabelAndClient(source))
    local = TarShards(str(tmp_path / "packed"), transform=label)
    shuffled = {"shuffle": True, "generator": torch.Generator().manual_seed(3)}
    shuffled_again = {"shuffle": True, "generator": torch.Generator().manual_seed(3)}
    try:
        got = _labels(remote, **shuffled)
    finally:
        source.close()  # type: ignore[attr-defined]
    assert [int(x) for x, _ in got] == _labels(local, **shuffled_again)
    shards = [f"/packed/{Path(s.path).name}" for s in local.shards]
    if fetch == "shard":  # each shard once, downloaded by the main process
        assert all(served.gets[p] == 1 for p in shards)
        assert not any(c for _, c in got)
    else:  # a ranged GET per sample, by the workers
        assert sum(served.gets.get(p, 0) for p in shards) == len(local)


def test_a_stream_over_an_http_pack_equals_the_local_one(served, tmp_path) -> None:
    url = f"{served.url}/packed/index.json"
    source = open_source(url, retry=FAST_RETRY, fetch="shard",
                         cache_dir=str(tmp_path / "cache"), cache_bytes=10**7)
    options = {"shuffle_buffer": 6, "seed": 5}
    remote = TarShardStream(url, source=source, transform=label, **options)
    try:
        got = _labels(remote)
    finally:
        source.close()  # type: ignore[attr-defined]
    assert got == _labels(TarShardStream(str(tmp_path / "packed"), transform=label, **options))
    assert sorted(got) == list(range(29))
    shards = [f"/packed/{Path(s.path).name}" for s in TarShards(str(tmp_path / "packed")).shards]
    assert all(served.gets[p] == 1 for p in shards)


def test_a_missing_object_over_http_is_named(served) -> None:
    url = f"{served.url}/packed/nope.json"
    source = open_source(url, retry=FAST_RETRY)
    try:
        with pytest.raises(FileNotFoundError) as info:
            TarShards(url, source=source)
    finally:
        source.close()  # type: ignore[attr-defined]
    assert url in str(info.value)


@contextlib.contextmanager
def _silent_server() -> Iterator[str]:
    """A server that accepts connections and never answers (a stuck proxy, a half-open
    connection): its URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # the listener closed: done
            while True:
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, name="silent-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(timeout=10)
        for connection in accepted:
            connection.close()


def test_a_server_that_never_answers_fails_the_read_within_its_read_timeout() -> None:
    """NOTE [ Requests that never answer ]: the user's own timeout, given through
    storage_options, bounds each attempt; the stall is retried, then named."""
    with _silent_server() as url:
        timeout = _client_timeout(sock_connect=5, sock_read=0.2)
        source = open_source(url, storage_options={"client_kwargs": {"timeout": timeout}},
                             retry=RetryPolicy(attempts=2, base_delay_s=0.01))
        try:
            with pytest.raises(RemoteReadError) as info:
                source.get_range(f"{url}/x.tar", 0, 10)  # type: ignore[attr-defined]
        finally:
            source.close()  # type: ignore[attr-defined]
    assert info.value.attempts == 2 and isinstance(info.value.__cause__, TimeoutError)
    assert str(info.value).startswith(
        f"reading {url}/x.tar (bytes 0..10) failed after 2 attempt(s), the last error: ")
    assert "Timeout" in str(info.value)  # the stall is named, not an empty message


def test_a_gcs_server_that_never_answers_fails_the_read_within_its_read_timeout() -> None:
    """gcsfs gives each request its own timeout (``requests_timeout``, none by default): the
    user's bounds each attempt, and stoker's default is set when the user gives none."""
    pytest.importorskip("gcsfs", reason="reading gs:// needs gcsfs (gcs extra)")
    from _gcs_server import _plain_gcsfs

    _plain_gcsfs()
    with _silent_server() as url:
        options = {"endpoint_url": url, "token": "anon"}
        timeout = _client_timeout(sock_read=0.2)
        source = open_source("gs://b/k", retry=RetryPolicy(attempts=2, base_delay_s=0.01),
                             storage_options={**options, "requests_timeout": timeout})
        default = open_source("gs://b/k", storage_options=options)
        try:
            with pytest.raises(RemoteReadError) as info:
                source.get_range("gs://b/k", 0, 10)  # type: ignore[attr-defined]
            assert default._fs().fs.requests_timeout == _client_timeout(  # type: ignore
                total=None, sock_connect=5, sock_read=15)
        finally:
            source.close()  # type: ignore[attr-defined]
            default.close()  # type: ignore[attr-defined]
    assert info.value.attempts == 2 and "Timeout" in str(info.value)


def test_requests_get_connect_and_read_timeouts_unless_the_options_set_their_own(
    served,
) -> None:
    source = open_source(served.url, retry=FAST_RETRY)
    own = _client_timeout(sock_read=60)
    theirs = open_source(served.url, retry=FAST_RETRY,
                         storage_options={"client_kwargs": {"timeout": own}})
    try:
        default = source._fs().fs.client_kwargs["timeout"]  # type: ignore[attr-defined]
        assert default == _client_timeout(total=None, sock_connect=5, sock_read=15)
        assert theirs._fs().fs.client_kwargs["timeout"] is own  # type: ignore[attr-defined]
    finally:
        source.close()  # type: ignore[attr-defined]
        theirs.close()  # type: ignore[attr-defined]


class _WholeObjectsHandler(_Handler):
    """A server that ignores ``Range`` and always sends the whole file."""

    def _answer(self, body: bool) -> None:
        self.headers.replace_header("Range", "") if "Range" in self.headers else None
        super()._answer(body)


def test_a_server_that_ignores_byte_ranges_is_named_after_one_request(served, tmp_path) -> None:
    served._server.RequestHandlerClass = _WholeObjectsHandler
    url = f"{served.url}/packed/index.json"
    source = open_source(url, retry=FAST_RETRY, fetch="range")
    try:
        dataset = TarShards(url, source=source)
        served.gets.clear()
        with pytest.raises(ShardError) as info:
            dataset[0]
    finally:
        source.close()  # type: ignore[attr-defined]
    shard = Path(dataset.shards[0].path).name
    assert served.gets == {f"/packed/{shard}": 1}  # not retried
    error = info.value.__cause__
    assert isinstance(error, RemoteReadError) and error.attempts == 1
    assert "the server ignored the Range header" in str(error)


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _target(fd: str) -> str:
    """What an fd is (``socket:[inode]``, a path, ``anon_inode:[eventpoll]``), for the error."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "(closed meanwhile)"


def _tcp_local_ports() -> dict[str, int]:
    """``socket:[inode]`` -> local port, for this machine's TCP sockets."""
    ports: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                ports[f"socket:[{fields[9]}]"] = int(fields[1].rsplit(":", 1)[1], 16)
    return ports


def _opened_by_the_client(fds: set[str], server_port: int) -> dict[str, str]:
    """The fds not in ``fds`` that the code under test opened: every new fd but the test
    server's (in this process) ends of its connections, whose local port is the server's. The
    server accepts and closes on its own threads, on its own schedule (a connection the client
    opened and dropped may be accepted only now): by owner, not by count (issue 47)."""
    left = {fd: _target(fd) for fd in _open_fds() - fds}
    left = {fd: t for fd, t in left.items() if t != "(closed meanwhile)"}
    if any(t.startswith("socket:") for t in left.values()):
        ports = _tcp_local_ports()
        left = {fd: t for fd, t in left.items() if ports.get(t) != server_port}
    return left


def test_sources_dropped_without_close_leave_no_thread_or_fd_behind(served) -> None:
    """NOTE [ A source dropped without close ]: collecting a source stops its loop thread
    (and the loop's executor thread) and closes its connections and the loop's fds."""
    url = f"{served.url}/packed/index.json"
    port = int(served.url.rsplit(":", 1)[1])
    fds = _open_fds()
    threads = []
    for _ in range(3):
        source = open_source(url, retry=FAST_RETRY, fetch="range")
        TarShards(url, source=source)[0]  # connected: a session, a connection, executor
        threads.append(source._handle.thread)  # type: ignore[attr-defined]
        del source
    gc.collect()
    for thread in threads:
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in threads)
    assert [t.name for t in threading.enumerate() if t.name.startswith("asyncio_")] == []
    gc.collect()  # the filesystems, let go by their loop threads
    # The loop threads have ended, so whatever they closed is closed; the poll only lets an
    # fd another thread is closing at this instant finish.
    poll_until(lambda: not _opened_by_the_client(fds, port), 10)
    assert _opened_by_the_client(fds, port) == {}

