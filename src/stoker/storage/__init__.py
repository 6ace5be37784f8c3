"""Where bytes at rest come from: local files or object stores (through ``fsspec``), read whole or
by range, cached and fetched ahead. Record formats (``stoker.formats``) read through a
``ByteSource`` and never open files themselves."""

from stoker.storage.cache import ShardCache
from stoker.storage.remote import RemoteSource, open_source
from stoker.storage.retry import RemoteReadError, RetryPolicy
from stoker.storage.source import ByteSource, LocalSource

__all__ = [
    "ByteSource",
    "LocalSource",
    "RemoteReadError",
    "RemoteSource",
    "RetryPolicy",
    "ShardCache",
    "open_source",
]
