"""A static file server over real HTTP with byte ranges (``Range: bytes=a-b`` -> 206), for
reading datasets from ``http://`` URLs as from any web server or CDN: what
``http.server.SimpleHTTPRequestHandler`` lacks. Counts GETs per path."""

from __future__ import annotations

import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _file(self) -> str | None:
        path = os.path.normpath(os.path.join(self.server.root, self.path.split("?")[0].lstrip("/")))
        return path if path.startswith(self.server.root) and os.path.isfile(path) else None

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        with self.server.lock:
            key = self.path.split("?")[0]
            self.server.gets[key] = self.server.gets.get(key, 0) + 1
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        path = self._file()
        if path is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with open(path, "rb") as f:
            data = f.read()
        start, end, status = 0, len(data), 200
        wanted = _RANGE.match(self.headers.get("Range", ""))
        if wanted:
            start = int(wanted.group(1))
            end = min(len(data), int(wanted.group(2)) + 1) if wanted.group(2) else len(data)
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if body:
            self.wfile.write(data[start:end])


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = os.path.abspath(root)
        self.gets: dict[str, int] = {}
        self.lock = threading.Lock()


class HTTPFiles:
    """Serves ``root`` at ``url`` until ``stop()`` (or the end of a ``with`` block)."""

    def __init__(self, root: str) -> None:
        self._server = _Server(root)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.gets = self._server.gets
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def join_handlers(self, timeout: float = 10.0) -> None:
        """Wait for the threads serving connections to end (each ends when its client has
        closed the connection): their sockets are this process's fds until then."""
        for thread in list(getattr(self._server, "_threads", None) or ()):
            thread.join(timeout=timeout)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> HTTPFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
