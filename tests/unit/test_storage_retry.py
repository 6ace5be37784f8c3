"""read_with_retries: transient errors retried with jittered, growing waits; short reads are
errors; permanent errors are not retried; the final error names the object."""

from __future__ import annotations

import errno
import pickle
import random

import pytest

from stoker.errors import StokerError
from stoker.storage import RemoteReadError, RetryPolicy
from stoker.storage.retry import (
    RangeIgnored,
    ReadRequest,
    TruncatedRead,
    is_transient,
    read_with_retries,
)
from stoker.workers.remote_errors import _Carrier


def _flaky(outcomes: list) -> tuple[list[int], object]:
    calls: list[int] = []

    def read() -> bytes:
        calls.append(1)
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return calls, read


def test_transient_errors_and_short_reads_are_retried_then_the_bytes_returned() -> None:
    waits: list[float] = []
    calls, read = _flaky([ConnectionResetError("reset"), b"abc", OSError(5, "503"), b"abcd"])
    data = read_with_retries(ReadRequest("s3://b/k", 0, 4), read, RetryPolicy(attempts=5),
                             4, sleep=waits.append)
    assert data == b"abcd" and len(calls) == 4
    policy = RetryPolicy()
    assert [w <= policy.base_delay_s * 2**k for k, w in enumerate(waits)] == [True] * 3


def test_waits_grow_exponentially_with_full_jitter_and_a_ceiling() -> None:
    policy = RetryPolicy(attempts=10, base_delay_s=0.5, max_delay_s=3.0)
    rng = random.Random(0)
    for attempt, ceiling in [(2, 0.5), (3, 1.0), (4, 2.0), (5, 3.0), (9, 3.0)]:
        draws = [policy.delay_s(attempt, rng) for _ in range(2000)]
        assert 0 <= min(draws) and max(draws) <= ceiling
        assert max(draws) > 0.95 * ceiling and min(draws) < 0.05 * ceiling  # spread, jittered


def test_giving_up_names_the_object_range_attempts_and_last_error() -> None:
    calls, read = _flaky([TruncatedRead("got 3 bytes, expected 4")] * 3)
    with pytest.raises(RemoteReadError) as info:
        read_with_retries(ReadRequest("s3://b/shard-7.tar", 1024, 4), read,
                          RetryPolicy(attempts=3), 4, sleep=lambda s: None)
    error = info.value
    assert str(error) == (
        "reading s3://b/shard-7.tar (bytes 1024..1028) failed after 3 attempt(s), the last "
        "error: TruncatedRead: got 3 bytes, expected 4 (a store failing this long is down or "
        "overloaded: check it, or allow more tries with RetryPolicy(attempts=...))"
    )
    assert (error.url, error.offset, error.length, error.attempts) == (
        "s3://b/shard-7.tar", 1024, 4, 3)
    assert isinstance(error.__cause__, TruncatedRead) and len(calls) == 3
    for again in (pickle.loads(pickle.dumps(error)),  # crosses from a worker as itself
                  pickle.loads(pickle.dumps(_Carrier(error)))):
        assert (str(again), again.url, again.offset, again.attempts) == (
            str(error), error.url, error.offset, error.attempts)
        assert isinstance(again, OSError) and isinstance(again, StokerError)


def test_permanent_errors_are_not_retried() -> None:
    calls, read = _flaky([PermissionError("AccessDenied")] * 3)
    with pytest.raises(RemoteReadError) as info:
        read_with_retries(ReadRequest("gs://b/k"), read, RetryPolicy(attempts=3), None,
                          sleep=lambda s: None)
    assert str(info.value) == (
        "reading gs://b/k (whole object) failed after a permanent error, not retried: "
        "PermissionError: AccessDenied"
    )
    assert len(calls) == 1
    calls, read = _flaky([FileNotFoundError("no key")])
    with pytest.raises(FileNotFoundError) as missing:
        read_with_retries(ReadRequest("s3://b/k"), read, RetryPolicy(), None,
                          sleep=lambda s: None)
    assert str(missing.value) == "s3://b/k: no such object (FileNotFoundError: no key)"


def test_missing_credentials_are_not_retried_and_say_where_credentials_come_from() -> None:
    exceptions = pytest.importorskip("botocore.exceptions")
    for missing in (exceptions.NoCredentialsError(),
                    exceptions.PartialCredentialsError(provider="env", cred_var="secret")):
        calls, read = _flaky([missing] * 3)
        with pytest.raises(RemoteReadError) as info:
            read_with_retries(ReadRequest("s3://b/k"), read, RetryPolicy(attempts=3), None,
                              sleep=lambda s: None)
        assert len(calls) == 1 and info.value.__cause__ is missing
        assert str(info.value) == (
            f"reading s3://b/k (whole object) failed after a permanent error, not retried: "
            f"{type(missing).__name__}: {missing}; credentials come from the store's standard "
            "chain (for S3: the AWS_* environment variables, ~/.aws config files, the "
            "instance's role) or from storage_options (key, secret, token; anon=True for a "
            "public bucket)")


def test_a_ranged_read_answered_with_more_bytes_says_the_server_ignored_the_range() -> None:
    calls, read = _flaky([b"x" * 40960] * 3)
    with pytest.raises(RemoteReadError) as info:
        read_with_retries(ReadRequest("http://h/s.tar", 512, 3024), read,
                          RetryPolicy(attempts=3), 3024, sleep=lambda s: None)
    assert len(calls) == 1 and isinstance(info.value.__cause__, RangeIgnored)
    assert str(info.value) == (
        "reading http://h/s.tar (bytes 512..3536) failed after a permanent error, not retried: "
        "RangeIgnored: got 40960 bytes for a range of 3024: the server ignored the Range "
        "header (it sends whole objects); read whole shards (fetch='shard' with a cache) or "
        "serve the files with byte ranges")


def test_an_error_without_a_message_is_told_by_the_one_it_was_raised_from() -> None:
    class FSTimeoutError(TimeoutError):  # fsspec's, raised from aiohttp's
        pass

    stalled = FSTimeoutError()
    stalled.__cause__ = TimeoutError("Timeout on reading data from socket")
    calls, read = _flaky([stalled] * 2)
    with pytest.raises(RemoteReadError) as info:
        read_with_retries(ReadRequest("http://h/k", 0, 4), read, RetryPolicy(attempts=2), 4,
                          sleep=lambda s: None)
    assert str(info.value).startswith(
        "reading http://h/k (bytes 0..4) failed after 2 attempt(s), the last error: "
        "FSTimeoutError: TimeoutError: Timeout on reading data from socket (")


def test_what_counts_as_transient() -> None:
    assert all(is_transient(e) for e in [ConnectionResetError(), TimeoutError(), OSError(5, "x"),
                                         TruncatedRead("short"), RuntimeError("5xx")])
    assert not any(is_transient(e) for e in [FileNotFoundError(), PermissionError(),
                                             ValueError(), KeyboardInterrupt()])
    # A full local disk (writing a download to the cache) is not fixed by reading again.
    assert not any(is_transient(OSError(n, "full")) for n in (errno.ENOSPC, errno.EDQUOT))


class _HTTPReplyError(Exception):  # a client's error carrying the reply's status
    def __init__(self, attribute: str, status: int) -> None:
        super().__init__(f"HTTP {status}")
        setattr(self, attribute, status)


def test_an_http_reply_that_refuses_the_request_is_not_transient() -> None:
    # aiohttp's ClientResponseError has .status, gcsfs's HttpError .code; gcsfs reports a
    # 403 as OSError("Forbidden: <url>").
    for attribute in ("status", "code"):
        assert not any(is_transient(_HTTPReplyError(attribute, s)) for s in (400, 403, 404, 416))
        assert all(is_transient(_HTTPReplyError(attribute, s))
                   for s in (401, 408, 429, 500, 503))
    assert not is_transient(OSError("Forbidden: http://h/b/o\nAccessDenied"))


def test_a_bad_policy_says_what_is_allowed() -> None:
    with pytest.raises(ValueError) as info:
        RetryPolicy(attempts=0)
    assert str(info.value) == (
        "RetryPolicy(attempts=0, base_delay_s=0.2, max_delay_s=10.0): attempts must be >= 1 "
        "and the delays >= 0"
    )


def test_open_source_takes_remote_options_for_any_path_and_refuses_unknown_ones(tmp_path) -> None:
    from stoker.storage import LocalSource, open_source

    (tmp_path / "a.bin").write_bytes(b"abc")
    local = open_source(str(tmp_path), cache_dir="/unused", cache_bytes=1, fetch="range")
    assert isinstance(local, LocalSource)
    assert local.read_range(str(tmp_path / "a.bin"), 1, 2) == b"bc"
    with pytest.raises(TypeError, match="cache_size"):
        open_source(str(tmp_path), cache_size=1)


def test_a_download_stopped_by_its_process_exiting_is_not_retried() -> None:
    """NOTE [ A download gives up at exit ] (storage/exit_watch.py): as raised, and as a client
    wraps it, never retried (each try would only back off before the process can exit)."""
    from stoker.storage.exit_watch import DownloadAborted

    aborted = DownloadAborted("the process is exiting: its downloads in flight stop")
    wrapped = OSError("get_file failed")
    wrapped.__cause__ = aborted
    assert not is_transient(aborted) and not is_transient(wrapped)
    assert is_transient(OSError("connection reset"))
