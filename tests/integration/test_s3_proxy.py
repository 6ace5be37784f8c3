"""The test S3 server's proxy (``_s3_server.py``) that the remote benchmarks read through: its
bandwidth cap, shared by all connections, and its streamed bodies.

Timing is only ever bounded below (a cap can only make a read slower, and so can a loaded
machine), never above."""

from __future__ import annotations

import http.client
import os
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from _optional import skip_module_unless

skip_module_unless(
    ("moto", "the S3 test server is moto (test extra)"),
    ("boto3", "the proxy's client is boto3 (test extra)"),
)

from _s3_server import CHUNK_BYTES, S3Server, S3ServerProcess  # noqa: E402

CAP_BPS = 20e6


@pytest.fixture
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


def _through_proxy(s3: S3Server | S3ServerProcess) -> object:
    """A boto3 client that talks to the proxy (``s3.client()`` goes straight to moto)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=s3.endpoint_url, region_name="us-east-1",
                        config=Config(retries={"max_attempts": 1}))


def _put(s3: S3Server | S3ServerProcess, key: str, size: int) -> bytes:
    payload = os.urandom(size)
    client = s3.client()
    try:
        client.create_bucket(Bucket="cap")
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    client.put_object(Bucket="cap", Key=key, Body=payload)
    client.close()
    return payload


def _timed_get(client: object, key: str) -> tuple[bytes, float]:
    start = time.perf_counter()
    body = client.get_object(Bucket="cap", Key=key)["Body"].read()  # type: ignore[attr-defined]
    return body, time.perf_counter() - start


def test_a_capped_proxy_sends_a_body_no_faster_than_its_cap(s3: S3Server) -> None:
    payload = _put(s3, "4mb", 4_000_000)
    client = _through_proxy(s3)
    assert _timed_get(client, "4mb")[0] == payload  # connected, uncapped
    s3.faults.bandwidth_bps = CAP_BPS
    body, elapsed = _timed_get(client, "4mb")
    client.close()  # type: ignore[attr-defined]
    assert body == payload
    # The bucket holds one chunk: the rest waits its share, (4 MB - 64 KiB) / 20 MB/s = 0.197 s.
    assert elapsed >= 0.18, f"4 MB at a {CAP_BPS / 1e6:.0f} MB/s cap took {elapsed:.3f} s"
    assert s3.faults.body_bytes == 2 * len(payload)


def test_the_cap_is_shared_by_all_connections(s3: S3Server) -> None:
    payloads = {key: _put(s3, key, 2_000_000) for key in ("a", "b")}
    clients = {key: _through_proxy(s3) for key in payloads}
    for key, client in clients.items():
        assert _timed_get(client, key)[0] == payloads[key]  # each connected, uncapped
    s3.faults.bandwidth_bps = CAP_BPS
    barrier = threading.Barrier(3, timeout=30)
    bodies: dict[str, bytes] = {}

    def get(key: str) -> None:
        barrier.wait()
        bodies[key] = _timed_get(clients[key], key)[0]

    threads = [threading.Thread(target=get, args=(key,)) for key in payloads]
    for thread in threads:
        thread.start()
    start = time.perf_counter()  # before the GETs can start: elapsed is never short
    barrier.wait()
    for thread in threads:
        thread.join(timeout=60)
    elapsed = time.perf_counter() - start
    for client in clients.values():
        client.close()  # type: ignore[attr-defined]
    assert bodies == payloads
    # Two 2 MB bodies at once share the cap: 4 MB less one chunk at 20 MB/s, as one would.
    assert elapsed >= 0.18, f"2 x 2 MB at a {CAP_BPS / 1e6:.0f} MB/s cap took {elapsed:.3f} s"


def _send_buffer_max() -> int:
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            return int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 << 20


def test_a_body_streams_and_a_client_leaving_mid_body_leaves_the_proxy_serving(
        s3: S3Server) -> None:
    # Larger than what the proxy's send buffer and the client's (made small) receive buffer
    # can hold together: a proxy that read the body whole before writing it would count it all.
    size = 3 * max(_send_buffer_max(), 4 << 20)
    payload = _put(s3, "big", size)
    client = _through_proxy(s3)
    try:
        url = urlsplit(client.generate_presigned_url(  # type: ignore[attr-defined]
            "get_object", Params={"Bucket": "cap", "Key": "big"}, ExpiresIn=600))
        host, port = url.hostname or "", url.port or 80
        conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.sock = socket.create_connection((host, port), timeout=30)
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        conn.request("GET", f"{url.path}?{url.query}")
        reply = conn.getresponse()
        assert reply.status == 200 and reply.length == size
        assert reply.read(CHUNK_BYTES) == payload[:CHUNK_BYTES]  # the first bytes, early
        sent = s3.faults.body_bytes
        assert sent < size * 2 // 3, (
            f"the proxy wrote {sent} of {size} bytes to a client that read {CHUNK_BYTES}")
        conn.close()  # mid-body: the proxy's write fails, its connection ends
        assert _timed_get(client, "big")[0] == payload  # and it serves the next one whole
    finally:
        # moto keeps a large object in a temporary file, and its objects outlive the server.
        client.delete_object(Bucket="cap", Key="big")  # type: ignore[attr-defined]
        client.close()  # type: ignore[attr-defined]


def test_the_cap_of_a_server_in_its_own_process_is_set_through_its_faults() -> None:
    with S3ServerProcess() as s3:
        payload = _put(s3, "4mb", 4_000_000)
        client = _through_proxy(s3)
        assert _timed_get(client, "4mb")[0] == payload
        s3.faults.bandwidth_bps = CAP_BPS
        assert s3.faults.bandwidth_bps == CAP_BPS
        body, elapsed = _timed_get(client, "4mb")
        client.close()  # type: ignore[attr-defined]
        assert body == payload
        assert elapsed >= 0.18, f"4 MB at a {CAP_BPS / 1e6:.0f} MB/s cap took {elapsed:.3f} s"
        assert s3.faults.body_bytes == 2 * len(payload)
