"""The few filesystem calls ``RemoteSource`` makes (``cat_file``, ``get_file``, ``size``,
``ls``), answered by obstore (Rust's ``object_store``) instead of s3fs: the opt-in
``open_source(..., client="obstore")``.

NOTE [ The obstore client ]
Why: an s3fs GET costs the calling process ~4-6 ms of Python CPU (botocore's signing and
parsing, asyncio), holding the GIL; obstore does the request in Rust with the GIL released
(~0.8 ms of CPU a GET measured on the same server). Importing s3fs and making its first client
took ~0.35 s of a fresh process's first batch; obstore imports in ~15 ms.
Fork: obstore's runtime (tokio's "tokio-rt-worker" threads, started by a process's first
request) does not survive ``fork``: in a child forked after it started, every request hangs,
even from a store made after the fork. A DataLoader forks its workers after the main process
has read the manifest, and the user's code (or a library: litdata downloads with obstore) may
have started it too. So a process uses obstore only when no process it was forked from had the
runtime running at the fork: each fork looks for the runtime's threads in the forking process
(``_before_fork``, one listing of ``/proc/self/task``) and the child remembers what it saw,
as do its own children. Where obstore cannot be used, the same ``storage_options`` go to s3fs.

NOTE [ The client by default ]
``client="auto"`` (the default) picks obstore only where it reads exactly what s3fs would:
``s3://`` with obstore and s3fs installed (s3fs for processes forked from one running obstore's
runtime), ``storage_options`` that all have an obstore counterpart, and credentials, region and
endpoint that both take from the same place. botocore also reads profiles, ``~/.aws`` files,
proxies, CA bundles, endpoint variables and follows a bucket's region redirects; obstore's chain
does not (and reads ``AWS_*`` variables botocore ignores). So auto picks s3fs when credentials
are neither in ``storage_options`` (key and secret, or anon) nor in ``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY``; when any other ``AWS_*`` variable than those, ``AWS_SESSION_TOKEN``
and the region's is set (``AWS_CA_BUNDLE`` too, unless the endpoint is plain ``http://``), or a
proxy variable; when the region is given nowhere (botocore would
find the bucket's; obstore would sign for us-east-1), unless an endpoint is given and there is
no ``~/.aws/config`` (both then sign for us-east-1). The batches are the same with either
client: only the requests' CPU and the first batch's time differ (``docs/benchmarks.md``).
``storage_options`` keep fsspec's (s3fs's) names, mapped here; credentials not given come from
obstore's chain (the ``AWS_*`` environment variables, web identity, the instance's metadata)
under ``client="obstore"``. Retries are stoker's (``stoker.storage.retry``): obstore's own are
turned off.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

# Set to this process's pid when it starts obstore's runtime: a forked child sees another pid.
_STARTED_IN: list[int] = []
# Whether a process this one was forked from (or its own parent, ...) ran a tokio runtime at
# the fork (NOTE [ The obstore client ]); _SEEN_AT_FORK carries the parent's look to the child.
_INHERITED_RUNTIME = False
_SEEN_AT_FORK = False
_STREAM_CHUNK = 256 << 10  # bytes a download writes at a time (~2.5 ms at 100 MB/s)
_RUNTIME_THREAD = "tokio-rt"  # tokio's threads: "tokio-rt-worker" (comm: 15 characters)
# AWS_* variables botocore and obstore read alike (the region's are checked to agree).
_SAME_IN_BOTH = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_DEFAULT_REGION", "AWS_REGION"}
_PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
_DEBUG_DUMP = "\n\nDebug source:"  # what follows it in obstore's messages: Rust's {:#?}
_METADATA_SERVICE = "169.254.169.254"  # the last link of obstore's credential chain


def runtime_threads_running() -> bool:
    """Whether a tokio runtime's threads run in this process (obstore's, once it made a
    request); without ``/proc`` (not Linux), whether obstore is imported at all."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return "obstore" in sys.modules
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm", encoding="utf-8", errors="replace") as f:
                if f.read().startswith(_RUNTIME_THREAD):
                    return True
        except OSError:  # the thread ended meanwhile
            continue
    return False


def _before_fork() -> None:
    global _SEEN_AT_FORK
    _SEEN_AT_FORK = not _INHERITED_RUNTIME and runtime_threads_running()


def _after_fork_in_child() -> None:
    global _INHERITED_RUNTIME
    _INHERITED_RUNTIME = _INHERITED_RUNTIME or _SEEN_AT_FORK


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def watch_forks(obstore: object) -> None:
    """Run when anything imports obstore after ``import stoker``: importing this module
    registered the fork hook above (NOTE [ The obstore client ])."""


def usable_here() -> bool:
    """Whether obstore can make requests in this process (NOTE [ The obstore client ])."""
    if _INHERITED_RUNTIME:
        return False
    return not _STARTED_IN or _STARTED_IN[0] == os.getpid()


def auto_client(protocol: str, options: dict[str, Any]) -> str:
    """``"obstore"`` or ``"fsspec"``: what ``client="auto"`` reads with (NOTE [ The client by
    default ]): obstore only where it gets the same objects with the same credentials."""
    if protocol not in ("s3", "s3a"):
        return "fsspec"
    import importlib.util

    if importlib.util.find_spec("obstore") is None or importlib.util.find_spec("s3fs") is None:
        return "fsspec"
    try:
        config = obstore_config(protocol, options)
    except ValueError:  # an option only s3fs takes
        return "fsspec"
    env = os.environ
    # A CA bundle matters only to TLS: over plain http:// (a server of one's own) both
    # clients read the same.
    same = _SAME_IN_BOTH | ({"AWS_CA_BUNDLE"} if str(config.get("endpoint", "")).startswith(
        "http://") else set())
    if any(k.startswith("AWS_") and k not in same for k in env) or any(
            env.get(k) or env.get(k.lower()) for k in _PROXIES):
        return "fsspec"
    if not config.get("skip_signature"):
        if "access_key_id" in config:
            if "session_token" not in config and env.get("AWS_SESSION_TOKEN"):
                return "fsspec"  # botocore drops the variable's token; obstore would add it
        elif not (env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY")):
            return "fsspec"  # credentials from a profile, a file, SSO, the instance...
    regions = {env[k] for k in ("AWS_DEFAULT_REGION", "AWS_REGION") if env.get(k)}
    if "region" not in config:
        if len(regions) > 1:
            return "fsspec"
        if not regions and ("endpoint" not in config
                            or os.path.exists(os.path.expanduser("~/.aws/config"))):
            return "fsspec"
    return "obstore"


def require_obstore() -> Any:
    try:
        import obstore
    except ImportError:
        raise ImportError(
            "client='obstore' needs obstore: pip install 'stoker[obstore]' (or leave client "
            "as 'fsspec', the default)") from None
    return obstore


def obstore_config(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    """obstore's S3 configuration from s3fs's ``storage_options``; a name with no obstore
    counterpart is an error naming it (it would otherwise be dropped without a word)."""
    if protocol not in ("s3", "s3a"):
        raise ValueError(f"client='obstore' reads s3:// here, not {protocol}://; use "
                         "client='fsspec' for it")
    options = dict(options)
    client_kwargs = dict(options.pop("client_kwargs", None) or {})
    config: dict[str, Any] = {}
    for ours, theirs in (("key", "access_key_id"), ("secret", "secret_access_key"),
                         ("token", "session_token"), ("endpoint_url", "endpoint")):
        if options.get(ours) is not None:
            config[theirs] = options.pop(ours)
        else:
            options.pop(ours, None)
    if options.pop("anon", False):
        config["skip_signature"] = True
    for ours, theirs in (("endpoint_url", "endpoint"), ("region_name", "region")):
        if client_kwargs.get(ours) is not None:
            config[theirs] = client_kwargs.pop(ours)
    unknown = sorted(options) + [f"client_kwargs.{k}" for k in sorted(client_kwargs)]
    if unknown:
        raise ValueError(
            f"storage_options {unknown} have no obstore counterpart here (it takes key, "
            "secret, token, anon, endpoint_url, client_kwargs.endpoint_url and "
            "client_kwargs.region_name): drop them or use client='fsspec'")
    if str(config.get("endpoint", "")).startswith("http://"):
        config["client_options"] = {"allow_http": True}
    return config


def _translated(exc: BaseException, path: str) -> BaseException:
    """obstore's errors as the built-in ones stoker's retry policy sorts (``is_transient``):
    missing and refused are permanent, the rest (5xx, resets, bodies cut short) transient.
    Their message without the ~20 lines of Rust debug dump that follow it (``exc`` stays
    chained as the cause)."""
    from obstore import exceptions as e

    summary = str(exc).split(_DEBUG_DUMP, 1)[0]
    if _METADATA_SERVICE in summary:
        return _no_credentials(path, summary)
    cause = f"{path}: {summary}"
    if isinstance(exc, (e.NotFoundError, FileNotFoundError)):
        return FileNotFoundError(cause)
    if isinstance(exc, (e.PermissionDeniedError, e.UnauthenticatedError, PermissionError)):
        return PermissionError(cause)
    if isinstance(exc, (e.InvalidPathError, e.UnknownConfigurationKeyError,
                        e.NotSupportedError)):
        return ValueError(cause)
    return OSError(cause)


def _no_credentials(path: str, summary: str) -> OSError:
    """obstore's chain found no credentials before the instance's metadata service, and
    that failed: permanent when it refused (e.g. 403: not an instance of the cloud), else
    retried (a metadata service that did not answer in time)."""
    status = re.search(r"status code: (\d{3})", summary)
    refused = status is not None and 400 <= int(status.group(1)) < 500 \
        and status.group(1) not in ("408", "429")
    error = PermissionError if refused else OSError
    return error(f"{path}: no credentials found: obstore looks in the AWS_* environment "
                 "variables, web identity, then the instance's metadata service, which failed "
                 f"({summary}); give them there or in storage_options (key, secret, token; "
                 "anon=True for a public bucket)")


class ObstoreFiles:
    """One process's obstore stores (one per bucket), behind the calls ``RemoteSource``
    makes of an fsspec filesystem."""

    def __init__(self, protocol: str, options: dict[str, Any]) -> None:
        self._obstore = require_obstore()
        self._config = obstore_config(protocol, options)
        self._stores: dict[str, Any] = {}
        if not _STARTED_IN:
            _STARTED_IN.append(os.getpid())

    def close(self) -> None:
        """Let the stores and their connections go (obstore's runtime stays: one a process)."""
        self._stores.clear()

    @staticmethod
    def _strip_protocol(path: str) -> str:
        return path.split("://", 1)[-1]

    def _store_and_key(self, path: str) -> tuple[Any, str]:
        bucket, _, key = self._strip_protocol(path).partition("/")
        store = self._stores.get(bucket)
        if store is None:
            from obstore.store import S3Store

            config: Any = dict(self._config)  # S3Config's keys (a TypedDict)
            client_options = config.pop("client_options", None)
            store = self._stores[bucket] = S3Store(
                bucket, config=config, client_options=client_options,
                retry_config={"max_retries": 0})
        return store, key

    def _call(self, path: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from obstore.exceptions import BaseError

        store, key = self._store_and_key(path)
        try:
            return fn(store, key, *args, **kwargs)
        except BaseError as exc:
            raise _translated(exc, path) from exc
        except (FileNotFoundError, PermissionError) as exc:  # obstore raises these too
            if exc.errno is not None:  # a local file's (get_file writes one)
                raise
            raise _translated(exc, path) from exc

    def cat_file(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        if end is None:
            data = self._call(path, lambda s, k: self._obstore.get(s, k).bytes())
        elif end <= start:
            return b""
        else:
            data = self._call(path, self._obstore.get_range, start=start, end=end)
        return bytes(data)

    def cat_buffer(self, path: str, start: int, end: int) -> Any:
        """``cat_file``'s bytes left in obstore's buffer (buffer protocol, ``len``): for
        writing them to a file, where a copy into ``bytes`` would only double the memory a
        download in flight holds (and the allocator keeps after it)."""
        if end <= start:
            return b""
        return self._call(path, self._obstore.get_range, start=start, end=end)

    def get_file(self, path: str, local: str, callback: Any = None) -> None:
        """``path`` written into ``local`` front to back; ``callback.relative_update`` (fsspec's)
        after each chunk (NOTE [ A download gives up at exit ] in ``exit_watch.py``)."""

        def stream(store: Any, key: str) -> int:
            result = self._obstore.get(store, key)
            expected = result.meta["size"]
            got = 0
            with open(local, "wb") as f:
                # Small chunks: readers read the file as it arrives (NOTE [ Reading a shard
                # while it arrives ] in cache.py); iterating gives 10 MiB ones.
                for chunk in result.stream(min_chunk_size=_STREAM_CHUNK):
                    got += f.write(chunk)
                    if callback is not None:
                        callback.relative_update(len(chunk))
            if got != expected:
                raise OSError(f"body cut short: {got} of {expected} bytes")
            return got

        self._call(path, stream)

    def size(self, path: str) -> int:
        return int(self._call(path, self._obstore.head)["size"])

    def ls(self, directory: str, detail: bool = True) -> list[dict[str, Any]]:
        bucket = self._strip_protocol(directory).partition("/")[0]

        def listing(store: Any, prefix: str) -> list[dict[str, Any]]:
            found = self._obstore.list_with_delimiter(store, prefix.rstrip("/") + "/")
            return [{"name": f"{bucket}/{o['path']}", "size": o["size"], "type": "file"}
                    for o in found["objects"]]

        return self._call(directory, listing)  # type: ignore[no-any-return]
