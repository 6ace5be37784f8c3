"""Record formats: datasets over data at rest (shards, columnar files, key-value stores), and
``pack``, which writes tar shards with an index.

Every reader takes ``source=`` (a ``stoker.storage.ByteSource``; default: local files, or the
object store a URL names) and reads its bytes only through it.

``SharedStrList``, ``SharedBytesList`` and ``SharedList`` lived here in stoker 0.1; they are
in ``stoker.sharing`` now and stay importable from here for code written against 0.1.
"""

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
