"""The public surface of ``stoker.formats`` (a public module of ``stoker``): locked like
``stoker.__all__``. Update the lock on purpose, in the same commit as the change."""

from __future__ import annotations

import stoker.formats

FORMATS_PUBLIC = [
    "ArrowDataset",
    "IMG_EXTENSIONS",
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
    "TFRecordDataset",
    "TarShard",
    "TarShardStream",
    "TarShards",
    "index_shard",
    "pack",
    "verify_pack",
]


def test_formats_all_is_the_locked_list() -> None:
    assert sorted(stoker.formats.__all__) == FORMATS_PUBLIC == sorted(FORMATS_PUBLIC)
    for name in FORMATS_PUBLIC:
        assert getattr(stoker.formats, name) is not None


def test_shard_error_is_a_stoker_error() -> None:
    assert issubclass(stoker.formats.ShardError, stoker.StokerError)
    assert stoker.formats.PackError is stoker.PackError
    assert issubclass(stoker.PackError, stoker.StokerError)
