"""Record formats: datasets over data at rest (shards, columnar files, key-value stores), and
``pack``, which writes tar shards with an index.

Every reader takes ``source=`` (a ``stoker.storage.ByteSource``; default: local files, or the
object store a URL names) and reads its bytes only through it.

``SharedStrList``, ``SharedBytesList`` and ``SharedList`` lived here in stoker 0.1; they are
in ``stoker.sharing`` now and stay importable from here for code written against 0.1.
"""

import sys as _sys
import types as _types
import typing as _typing

from stoker._core.lazy_exports import lazy_exports as _lazy_exports

# NOTE [ Import only what the loader needs ]: a reader loads its own modules, not every format's.
_LAZY = {
    "ArrowDataset": "stoker.formats.columnar",
    "IMG_EXTENSIONS": "stoker.formats.image_folder",
    "ImageFolder": "stoker.formats.image_folder",
    "LMDBDataset": "stoker.formats.lmdb_dataset",
    "PackError": "stoker.errors",
    "PackOptions": "stoker.formats.pack",
    "PackSummary": "stoker.formats.pack_report",
    "ParquetDataset": "stoker.formats.columnar",
    "SampleLocation": "stoker.formats.tar_shards",
    "ShardError": "stoker.errors",
    "ShardTable": "stoker.formats.tar_index",
    "SharedBytesList": "stoker.sharing.shared_list",
    "SharedList": "stoker.sharing.shared_list",
    "SharedStrList": "stoker.sharing.shared_list",
    "TFRecordDataset": "stoker.formats.tfrecord_dataset",
    "TarShard": "stoker.formats.tar_manifest",
    "TarShardStream": "stoker.formats.tar_stream",
    "TarShards": "stoker.formats.tar_shards",
    "index_shard": "stoker.formats.tar_index",
    "pack": "stoker.formats.pack",
    "verify_pack": "stoker.formats.pack_report",
}
__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)


class _Formats(_types.ModuleType):
    """``stoker.formats.pack`` is the function. Importing the module of the same name binds the
    module on this package (the import system does, once it has run), so that binding is
    turned into the function here, whichever of the two is read first."""

    def __setattr__(self, name: str, value: _typing.Any) -> None:
        if name == "pack" and isinstance(value, _types.ModuleType):
            value = value.pack
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Formats

if _typing.TYPE_CHECKING:
    from stoker.errors import PackError, ShardError
    from stoker.formats.columnar import ArrowDataset, ParquetDataset
    from stoker.formats.image_folder import IMG_EXTENSIONS, ImageFolder
    from stoker.formats.lmdb_dataset import LMDBDataset
    from stoker.formats.pack import PackOptions, pack
    from stoker.formats.pack_report import PackSummary, verify_pack
    from stoker.formats.tar_index import ShardTable, index_shard
    from stoker.formats.tar_manifest import TarShard
    from stoker.formats.tar_shards import SampleLocation, TarShards
    from stoker.formats.tar_stream import TarShardStream
    from stoker.formats.tfrecord_dataset import TFRecordDataset
    from stoker.sharing.shared_list import SharedBytesList, SharedList, SharedStrList

__all__ = [
    "IMG_EXTENSIONS",
    "ArrowDataset",
    "ImageFolder",
    "LMDBDataset",
    "PackError",
    "PackOptions",
    "PackSummary",
    "ParquetDataset",
    "SampleLocation",
    "ShardError",
    "ShardTable",
    "SharedBytesList",
    "SharedList",
    "SharedStrList",
    "TarShard",
    "TarShardStream",
    "TarShards",
    "TFRecordDataset",
    "index_shard",
    "pack",
    "verify_pack",
]
