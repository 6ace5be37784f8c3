"""A real Google Cloud Storage API over HTTP for tests: ``gcp-storage-emulator`` (the JSON API
gcsfs speaks, in memory) behind the fault-injecting proxy of ``_s3_server``, both on localhost
threads of the calling process. Clients talk to the proxy (``storage_options``), which adds
latency and fails chosen requests as it does for S3 (``Faults``)."""

from __future__ import annotations

import http.client
import logging
import os
import threading
from typing import Any
from urllib.parse import quote

from _s3_server import Faults, _ProxyServer


def _plain_gcsfs() -> None:
    """gs:// through gcsfs's JSON API filesystem: its default one (``ExtendedGcsFileSystem``,
    unless ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` when gcsfs is imported) first asks each
    bucket's layout over gRPC, which no emulator answers (a 60 s timeout per bucket, then the
    JSON API all the same)."""
    import fsspec
    from gcsfs.core import GCSFileSystem

    for protocol in ("gs", "gcs"):
        fsspec.register_implementation(protocol, GCSFileSystem, clobber=True)


class GCSServer:
    """The emulator + the proxy. ``with GCSServer() as gcs: gcs.storage_options`` for gcsfs."""

    def __init__(self, bucket: str = "bench") -> None:
        from gcp_storage_emulator.server import create_server

        logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
        _plain_gcsfs()
        self.faults = Faults()
        self._emulator = create_server("127.0.0.1", 0, in_memory=True, default_bucket=bucket)
        self._emulator.start()
        self._proxy = _ProxyServer(self._emulator._api._httpd.server_address[:2], self.faults)
        self._thread = threading.Thread(
            target=self._proxy.serve_forever, kwargs={"poll_interval": 0.05}, name="gcs-proxy"
        )
        self._thread.start()

    @property
    def endpoint_url(self) -> str:
        host, port = self._proxy.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint_url, "token": "anon", "project": "test"}

    def upload_dir(self, local_dir: str, bucket: str, prefix: str = "") -> None:
        """Copy a directory in, straight to the emulator (no faults): one JSON API upload per
        file, over plain HTTP (no client left running)."""
        host, port = self._emulator._api._httpd.server_address[:2]
        connection = http.client.HTTPConnection(host, port, timeout=60)
        try:
            for root, _, files in os.walk(local_dir):
                for name in files:
                    path = os.path.join(root, name)
                    key = os.path.join(prefix, os.path.relpath(path, local_dir)).lstrip("/")
                    with open(path, "rb") as f:
                        connection.request("POST", f"/upload/storage/v1/b/{bucket}/o?"
                                           f"uploadType=media&name={quote(key, safe='')}",
                                           body=f.read())
                    reply = connection.getresponse()
                    if reply.read() is not None and reply.status != 200:
                        raise OSError(f"uploading {key}: HTTP {reply.status}")
        finally:
            connection.close()

    def stop(self) -> None:
        self._proxy.shutdown()
        self._proxy.drop_connections()
        self._proxy.server_close()  # joins the connection threads
        self._thread.join(timeout=10)
        self._emulator.stop()

    def __enter__(self) -> GCSServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
