"""Where bytes at rest come from: local files or object stores (through ``fsspec``), read whole or
by range, cached and fetched ahead. Record formats (``stoker.formats``) read through a
``ByteSource`` and never open files themselves."""

import typing as _typing

from stoker._core.lazy_exports import lazy_exports as _lazy_exports

# NOTE [ Import only what the loader needs ]: a reader of local files never loads fsspec's side.
_LAZY = {
    "ByteSource": "stoker.storage.source",
    "ByteSourceExtras": "stoker.storage.source",
    "LocalSource": "stoker.storage.source",
    "RemoteReadError": "stoker.errors",
    "RemoteSource": "stoker.storage.remote",
    "RetryPolicy": "stoker.storage.retry",
    "ShardCache": "stoker.storage.cache",
    "open_source": "stoker.storage.remote",
}
__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)

if _typing.TYPE_CHECKING:
    from stoker.storage.cache import ShardCache
    from stoker.storage.remote import RemoteSource, open_source
    from stoker.storage.retry import RemoteReadError, RetryPolicy
    from stoker.storage.source import ByteSource, ByteSourceExtras, LocalSource

__all__ = [
    "ByteSource",
    "ByteSourceExtras",
    "LocalSource",
    "RemoteReadError",
    "RemoteSource",
    "RetryPolicy",
    "ShardCache",
    "open_source",
]
