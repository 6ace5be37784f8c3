"""Retries of object-store reads: exponential backoff with full jitter, lengths verified.

A read either returns exactly the bytes asked for or raises ``RemoteReadError`` naming the
object, the byte range, the attempts and the last error. Retrying a read can neither duplicate
nor lose a sample: a sample is read by one call that returns its bytes once, whole, or raises;
a short body (a connection cut mid-transfer) is an error to retry, never bytes to return.

What is retried: errors that say nothing about the object itself (5xx replies, connection
resets and refusals, timeouts, truncated bodies). What is not: a missing object, a refused
permission, missing credentials, a bad argument, a server that ignores byte ranges, a request
that cannot start because its process is exiting; retrying those only delays the answer.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from stoker.errors import RemoteReadError
from stoker.storage.cache_ledger import disk_full
from stoker.storage.exit_watch import DownloadAborted

T = TypeVar("T")


class RangeIgnored(OSError):
    """The store answered a ranged read with more bytes than asked for: it ignores the
    ``Range`` header and sends whole objects, so reading again gets the same."""


# Errors that describe the request or the object, not the connection: never retried.
_PERMANENT: tuple[type[BaseException], ...] = (
    RangeIgnored,
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    ValueError,
    TypeError,
    NotImplementedError,
)


# botocore's: no credentials anywhere in the chain; asking again finds none either.
_NO_CREDENTIALS = ("NoCredentialsError", "PartialCredentialsError")
# concurrent.futures' refusal once the interpreter shuts down (asyncio's default executor).
_SHUT_DOWN = "cannot schedule new futures after interpreter shutdown"
_CREDENTIALS_HINT = (
    "credentials come from the store's standard chain (for S3: the AWS_* environment "
    "variables, ~/.aws config files, the instance's role) or from storage_options (key, "
    "secret, token; anon=True for a public bucket)")


class TruncatedRead(OSError):
    """The store answered with fewer bytes than asked for: a retryable error."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a read is retried.

    ``attempts``: tries in all (1 = no retry). The wait before try ``k`` (k >= 2) is drawn
    uniformly from ``[0, min(max_delay_s, base_delay_s * 2 ** (k - 2))]`` ("full jitter": ranks
    and workers that failed together do not retry together).
    """

    attempts: int = 6
    base_delay_s: float = 0.2
    max_delay_s: float = 10.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError(
                f"RetryPolicy(attempts={self.attempts}, base_delay_s={self.base_delay_s}, "
                f"max_delay_s={self.max_delay_s}): attempts must be >= 1 and the delays >= 0"
            )

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """The wait before try number ``attempt`` (2, 3, ...)."""
        ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 2))
        return rng.uniform(0.0, ceiling)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the read may succeed (not when the local disk it writes to is
    full: the cache reads by range instead, NOTE [ A full disk under the cache ])."""
    if disk_full(exc) or _refused(exc) or _no_credentials(exc) or _exiting(exc):
        return False
    return isinstance(exc, Exception) and not isinstance(exc, _PERMANENT)


def _exiting(exc: BaseException) -> bool:
    """The process is exiting: its thread pools take no new work, so no request can start
    (aiohttp looks a host up on one, for each new connection). Seen when a worker was stopped
    while its prefetch threads opened connections: every try failed alike, and the worker
    lived on through the backoff, ~5 s, before it could exit. Or a download stopped by its
    process's exit (NOTE [ A download gives up at exit ] in ``exit_watch.py``)."""
    seen: BaseException | None = exc
    for _ in range(8):  # the error a client wrapped it in, and that one's cause
        if seen is None:
            return False
        if _SHUT_DOWN in str(seen) or isinstance(seen, DownloadAborted):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _no_credentials(exc: BaseException) -> bool:
    """botocore found no credentials (named, not imported: s3fs is optional)."""
    return any(cls.__name__ in _NO_CREDENTIALS for cls in type(exc).__mro__)


def _refused(exc: BaseException) -> bool:
    """An HTTP reply that says the request itself is wrong, as a client reports it that does
    not map it to one of ``_PERMANENT`` (gcsfs's ``HttpError.code``, aiohttp's ``status``; a
    403 from gcsfs is a plain ``OSError("Forbidden: ...")``). Not 401 (gcsfs's expired token:
    the next try gets a fresh one), 408 or 429 (wait and try again)."""
    if type(exc) is OSError and str(exc).startswith("Forbidden"):
        return True
    for name in ("status", "code"):
        status = getattr(exc, name, None)
        if isinstance(status, int) and 400 <= status < 500:
            return status not in (401, 408, 429)
    return False


@dataclass(frozen=True)
class ReadRequest:
    """One read: ``length`` None means the whole object of ``expected_size`` bytes, if known."""

    url: str
    offset: int | None = None
    length: int | None = None

    def describe(self) -> str:
        if self.offset is None:
            return f"{self.url} (whole object)"
        return f"{self.url} (bytes {self.offset}..{self.offset + (self.length or 0)})"


def read_with_retries(
    request: ReadRequest,
    read: Callable[[], T],
    policy: RetryPolicy,
    expected: int | None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``read()`` until it succeeds (returning ``expected`` bytes, when given), retrying
    transient errors."""
    rng = random.Random()
    last: BaseException | None = None
    for attempt in range(1, policy.attempts + 1):
        if attempt > 1:
            sleep(policy.delay_s(attempt, rng))
        try:
            data = read()
            got = len(data) if isinstance(data, (bytes, bytearray, memoryview)) else None
            if expected is not None and got != expected:
                raise _wrong_length(request, got, expected)
            return data
        except Exception as exc:  # classified below; never swallowed
            last = exc
            if not is_transient(exc):
                break
    raise _final_error(request, attempt, last)


def _wrong_length(request: ReadRequest, got: int | None, expected: int) -> OSError:
    if got is not None and got > expected and request.offset is not None:
        return RangeIgnored(
            f"got {got} bytes for a range of {expected}: the server ignored the Range header "
            "(it sends whole objects); read whole shards (fetch='shard' with a cache) or "
            "serve the files with byte ranges")
    return TruncatedRead(f"got {got} bytes, expected {expected}")


def _describe(exc: BaseException) -> str:
    """``Type: message``; an empty message (fsspec's ``FSTimeoutError``) is told by the error
    it was raised from (aiohttp's ``SocketTimeoutError: Timeout on reading data ...``)."""
    text, inner = str(exc), exc.__cause__
    if not text and inner is not None and str(inner):
        text = f"{type(inner).__name__}: {inner}"
    return f"{type(exc).__name__}: {text or 'no message'}"


def _final_error(request: ReadRequest, attempts: int, last: BaseException | None) -> OSError:
    cause = _describe(last) if last is not None else "no error recorded"
    if last is not None and _no_credentials(last):
        what, cause = "a permanent error, not retried", f"{cause}; {_CREDENTIALS_HINT}"
    elif last is not None and not is_transient(last):
        what = "a permanent error, not retried"
    else:
        what = f"{attempts} attempt(s), the last error"
        if attempts > 1:
            cause += (" (a store failing this long is down or overloaded: check it, or "
                      "allow more tries with RetryPolicy(attempts=...))")
    error = RemoteReadError(f"reading {request.describe()} failed after {what}: {cause}")
    error.url, error.offset, error.length, error.attempts = (
        request.url, request.offset, request.length, attempts
    )
    error.__cause__ = last
    if isinstance(last, FileNotFoundError):  # keep the type users catch for a missing object
        missing = FileNotFoundError(f"{request.url}: no such object ({cause})")
        missing.__cause__ = error
        return missing
    return error
