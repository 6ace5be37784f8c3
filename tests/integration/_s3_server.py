"""A real S3-compatible server over HTTP for tests and benchmarks: moto in server mode behind a
small fault-injecting HTTP proxy, both on localhost threads of the calling process.

Clients talk to the proxy (``endpoint_url``); the proxy forwards each request to moto and can
add latency to every request, cap the bandwidth of all replies' bodies together
(``Faults.bandwidth_bps``), and fail chosen requests: a 5xx reply, a connection reset before
any reply, or a body cut short (the full ``Content-Length`` announced, part of it sent, the
connection closed). It counts requests, so tests can say how many GETs a read took.

Bodies stream: the proxy reads moto's reply ``CHUNK_BYTES`` at a time and writes each chunk
once the cap allows, so a client gets the first bytes of a large object early, as from a real
store, and a client that stops reading holds the proxy back (it reads a body of known length
no faster than it writes it).
"""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

Fault = Literal["status", "reset", "truncate"]
# What ``S3Server`` imports when it starts (``moto.server`` needs flask), for
# ``_optional.skip_module_unless(*SERVER_NEEDS, ...)`` in the modules that start one.
SERVER_NEEDS = (
    ("moto", "the S3 server tests need moto[server] (test extra)"),
    ("flask", "the S3 server tests need moto[server] (test extra)"),
)
CHUNK_BYTES = 64 * 1024  # what the proxy reads from moto and writes to a client at a time
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade",
               "proxy-connection", "trailer"}


@dataclass
class _Rule:
    kind: Fault
    match: str
    remaining: int
    status: int = 503


@dataclass
class Faults:
    """What the proxy does to requests; safe to change from any thread while it serves.

    ``bandwidth_bps``: bytes per second that all replies' bodies together may take (0: no
    cap), a token bucket that holds one chunk (``CHUNK_BYTES``): after a pause one chunk goes
    at once, then each waits for its share. ``body_bytes`` counts the body bytes written."""

    latency_s: float = 0.0
    bandwidth_bps: float = 0.0
    rules: list[_Rule] = field(default_factory=list)
    gets: int = 0
    heads: int = 0  # size requests: part of a cold start's cost
    injected: int = 0
    body_bytes: int = 0
    gets_by_path: dict[str, int] = field(default_factory=dict)
    # (method, path, the client's User-Agent) of every request: which client asked what, for
    # a test's failure message (obstore's and botocore's agents differ).
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _cap_free_at: float = 0.0  # when the bucket has the tokens of the chunks granted so far

    def fail(self, kind: Fault, match: str = "", times: int = 1, status: int = 503) -> None:
        """The next ``times`` GETs whose path contains ``match`` fail this way (-1: all)."""
        with self.lock:
            self.rules.append(_Rule(kind, match, times, status))

    def clear(self) -> None:
        with self.lock:
            self.rules.clear()

    def _take(self, method: str, path: str, agent: str = "") -> _Rule | None:
        with self.lock:
            self.requests.append((method, path, agent))
            if method == "HEAD":
                self.heads += 1
            if method != "GET":
                return None
            self.gets += 1
            key = path.split("?", 1)[0]
            self.gets_by_path[key] = self.gets_by_path.get(key, 0) + 1
            for rule in self.rules:
                if rule.match in path and rule.remaining != 0:
                    rule.remaining -= 1
                    self.injected += 1
                    return rule
        return None

    def _send(self, nbytes: int) -> None:
        """Wait until the cap lets ``nbytes`` more go (at once without a cap), count them."""
        rate = self.bandwidth_bps
        with self.lock:
            self.body_bytes += nbytes
            if rate <= 0:
                return
            now = time.monotonic()
            # A virtual clock: a chunk's tokens are there at _cap_free_at; the bucket holds
            # one chunk's worth, so an idle cap does not save up for a burst.
            start = max(self._cap_free_at, now - CHUNK_BYTES / rate)
            self._cap_free_at = start + nbytes / rate
            wait = self._cap_free_at - now
        if wait > 0:
            time.sleep(wait)  # the link's pace (what the cap simulates)


class _Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, add=True)
        host, port = self.server.upstream
        self.upstream = http.client.HTTPConnection(host, port, timeout=60)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.upstream.close()
            self.server.track(self.connection, add=False)

    def _handle(self) -> None:
        faults = self.server.faults
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if faults.latency_s:
            time.sleep(faults.latency_s)  # the server's own latency (what the test simulates)
        rule = faults._take(self.command, self.path, self.headers.get("User-Agent", ""))
        if rule is not None and rule.kind == "reset":
            self.close_connection = True
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            return
        if rule is not None and rule.kind == "status":
            payload = (f"<Error><Code>InjectedFault</Code><Message>injected {rule.status}"
                       "</Message></Error>").encode()
            self.send_response(rule.status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        self.upstream.request(self.command, self.path, body=body or None, headers=headers)
        reply = self.upstream.getresponse()
        if self.command == "HEAD":
            reply.read()
            length, first = int(reply.getheader("Content-Length") or 0), b""
        elif reply.length is None:  # chunked, or delimited by the close: read it whole
            first = reply.read()
            length = len(first)
        else:
            length, first = reply.length, b""
        self.send_response(reply.status, reply.reason)
        for key, value in reply.getheaders():
            if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if self.command == "HEAD":
            return
        truncate = rule is not None and rule.kind == "truncate" and length > 1
        try:
            self._stream(reply, first, length // 2 if truncate else length)
        except (OSError, http.client.HTTPException):  # the client or moto went away mid-body
            self.close_connection = True
            self.upstream.close()  # a reply read in part cannot be followed by another
            return
        if truncate:
            self.wfile.flush()
            self.close_connection = True
            self.upstream.close()
            self.connection.shutdown(socket.SHUT_RDWR)

    def _stream(self, reply: http.client.HTTPResponse, first: bytes, length: int) -> None:
        """Write ``length`` bytes of the body (``first``, then the rest of ``reply``) a chunk
        at a time, each when the bandwidth cap allows."""
        faults, sent, held = self.server.faults, 0, memoryview(first)
        while sent < length:
            if sent < len(held):
                chunk: bytes | memoryview = held[sent : sent + CHUNK_BYTES]
            else:
                chunk = reply.read(CHUNK_BYTES)
                if not chunk:
                    raise ConnectionError(f"moto's reply ended after {sent} of {length} bytes")
            chunk = chunk[: length - sent]
            faults._send(len(chunk))
            self.wfile.write(chunk)
            sent += len(chunk)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True

    def __init__(self, upstream: tuple[str, int], faults: Faults) -> None:
        super().__init__(("127.0.0.1", 0), _Proxy)
        self.upstream = upstream
        self.faults = faults
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def track(self, sock: socket.socket, add: bool) -> None:
        with self._open_lock:
            (self._open.add if add else self._open.discard)(sock)

    def drop_connections(self) -> None:
        """End idle keep-alive connections, so their threads finish."""
        with self._open_lock:
            for sock in list(self._open):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def _fake_credentials() -> None:
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(key, value)


def _upload_dir(client: Any, local_dir: str, bucket: str, prefix: str) -> None:
    """Every file under ``local_dir`` to ``bucket`` (made if missing) under ``prefix``."""
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    for root, _, files in os.walk(local_dir):
        for name in files:
            path = os.path.join(root, name)
            key = os.path.join(prefix, os.path.relpath(path, local_dir)).lstrip("/")
            client.upload_file(path, bucket, key)
    client.close()


class S3Server:
    """moto + the proxy. ``with S3Server() as s3: s3.storage_options`` for fsspec/s3fs."""

    def __init__(self) -> None:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

        _fake_credentials()
        self.faults = Faults()
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._moto.start()
        self._proxy = _ProxyServer(self._moto.get_host_and_port(), self.faults)
        self._thread = threading.Thread(
            target=self._proxy.serve_forever, kwargs={"poll_interval": 0.05}, name="s3-proxy"
        )
        self._thread.start()

    @property
    def endpoint_url(self) -> str:
        host, port = self._proxy.server_address[:2]
        assert isinstance(host, str)  # an AF_INET server's
        return f"http://{host}:{port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"client_kwargs": {"endpoint_url": self.endpoint_url}}

    def client(self) -> Any:
        """A boto3 client straight to moto (no faults), for setting up buckets."""
        import boto3

        host, port = self._moto.get_host_and_port()
        return boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1")

    def upload_dir(self, local_dir: str, bucket: str, prefix: str = "") -> None:
        _upload_dir(self.client(), local_dir, bucket, prefix)

    def stop(self) -> None:
        self._proxy.shutdown()
        self._proxy.drop_connections()
        self._proxy.server_close()  # joins the connection threads
        self._thread.join(timeout=10)
        self._moto.stop()

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _FaultsOverPipe:
    """``Faults``' latency, bandwidth cap and counters, for a server in another process
    (``s3.faults.bandwidth_bps = 100e6`` sets the child's cap)."""

    def __init__(self, ask: Any) -> None:
        object.__setattr__(self, "_ask", ask)

    def __getattr__(self, name: str) -> Any:
        return self._ask("get", name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._ask("set", name, value)


def _serve_stdio() -> None:
    """The child of ``S3ServerProcess``: a server, then one JSON command per stdin line."""
    with S3Server() as s3:
        print(json.dumps([s3.endpoint_url, s3._moto.get_host_and_port()]), flush=True)
        for line in sys.stdin:
            command, *args = json.loads(line)
            if command == "stop":
                return
            if command == "set":
                setattr(s3.faults, args[0], args[1])
            reply = getattr(s3.faults, args[0]) if command == "get" else None
            print(json.dumps(reply), flush=True)


class S3ServerProcess:
    """``S3Server`` in a process of its own, for benchmarks: a real store does not share the
    loader's interpreter, and in-process moto and proxy threads would hold the GIL of the
    process that receives batches. ``faults`` offers ``latency_s``, ``bandwidth_bps`` and the
    counters."""

    def __init__(self) -> None:
        _fake_credentials()
        self._process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)
        self.endpoint_url, self._moto = self._reply("start")
        self.faults = _FaultsOverPipe(self._ask)

    def _reply(self, what: str) -> Any:
        assert self._process.stdout is not None
        if not select.select([self._process.stdout], [], [], 120)[0]:
            self._process.kill()
            raise RuntimeError(f"the S3 server process did not answer {what!r} within 120 s")
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the S3 server process ended (exit {self._process.wait()})")
        return json.loads(line)

    def _ask(self, *command: Any) -> Any:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(command) + "\n")
        self._process.stdin.flush()
        return self._reply(command[0])

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"client_kwargs": {"endpoint_url": self.endpoint_url}}

    def client(self) -> Any:
        import boto3

        host, port = self._moto
        return boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1")

    def upload_dir(self, local_dir: str, bucket: str, prefix: str = "") -> None:
        _upload_dir(self.client(), local_dir, bucket, prefix)

    @property
    def pids(self) -> tuple[int, ...]:
        """The server's process (to leave out of the loaders' memory)."""
        return (self._process.pid,)

    def cpu_s(self) -> float:
        """CPU seconds the server process has used so far (user + system)."""
        with open(f"/proc/{self._process.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.write('["stop"]\n')
            self._process.stdin.close()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)

    def __enter__(self) -> S3ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    _serve_stdio()
