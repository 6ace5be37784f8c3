"""The manifest of a pack of tar shards (``index.json``, written by ``stoker pack``): the shards'
paths, sample counts and byte sizes, and the file holding every shard's index; read by both
readers (``TarShards``, ``TarShardStream``), which tell a remote source what it says."""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from stoker.errors import ShardError
from stoker.formats._common import join, parent
from stoker.formats.tar_index import TABLES_NAME, ShardTable, read_fresh, tables_from_bytes
from stoker.storage import ByteSource
from stoker.storage.source import ByteSourceExtras, extra

_GUESSED_TABLES_BYTES = 8 << 20  # NOTE [ The file of indexes alongside the manifest ]

MANIFEST_NAME = "index.json"
MANIFEST_FORMAT = "stoker-tar-shards"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class TarShard:
    """One shard of a dataset: where it is, how many samples it holds, its size in bytes."""

    path: str
    samples: int
    size_bytes: int


@dataclass(frozen=True)
class Manifest:
    """What ``index.json`` says: the shards, the pack's metadata, and the file holding every
    shard's index (``tables``, None for manifests written before it existed) and its size."""

    shards: list[TarShard]
    meta: dict[str, Any]
    tables: str | None = None
    tables_bytes: int = 0
    tables_data: bytes | None = field(default=None, repr=False)  # read alongside, if it was


# NOTE [ The file of indexes alongside the manifest ]
# Opening a remote pack took two round trips one after the other: the manifest, then the file
# of indexes it names. `stoker pack` always writes that file as TABLES_NAME beside the manifest,
# so from object storage its first _GUESSED_TABLES_BYTES are asked for at the same time and
# kept when the manifest names that file at that size (packs of up to ~40,000 samples at ~200
# bytes a sample); otherwise they are dropped and the file is read as before. A pack whose
# index file is larger pays one ranged GET it did not need.


def read_manifest(source: ByteSource, path: str) -> Manifest:
    """The manifest at ``path`` (NOTE [ The file of indexes alongside the manifest ])."""
    read_prefix = extra(source, ByteSourceExtras.read_prefix)
    if read_prefix is None:
        return _parse_manifest(_read_manifest_file(source, path), path)
    guess = join(parent(path), TABLES_NAME)
    with ThreadPoolExecutor(1) as pool:
        tables = pool.submit(read_prefix, guess, _GUESSED_TABLES_BYTES)
        manifest = _parse_manifest(_read_manifest_file(source, path), path)
        try:
            data = tables.result()
        except Exception:  # none there (a pack from before it), or failing: read when needed
            return manifest
    if manifest.tables == guess and len(data) == manifest.tables_bytes:
        return dataclasses.replace(manifest, tables_data=data)
    return manifest


def _read_manifest_file(source: ByteSource, path: str) -> bytes:
    try:
        return read_fresh(source, path)
    except NotADirectoryError as exc:  # "photo.jpg/index.json": a file given as a pack
        raise NotADirectoryError(
            f"{parent(path)} is a file, not a pack of shards. A pack is a directory written by "
            f"`stoker pack`, holding {MANIFEST_NAME} and the .tar shards it lists: pass that "
            f"directory or its {MANIFEST_NAME}; for tar shards without one, pass a .tar path, a "
            "list of them, or a pattern such as 'shards/s-{000000..000099}.tar'"
        ) from exc
    except FileNotFoundError as exc:
        missing = _missing_directory(parent(path))
        if missing:
            raise FileNotFoundError(missing) from exc
        raise FileNotFoundError(
            f"{path}: no such file: a directory of shards is opened through the {MANIFEST_NAME} "
            "`stoker pack` writes in it. For tar shards without one, pass the list of their "
            "paths (or a pattern such as 'shards/s-{000000..000099}.tar'), or pack them with "
            "`stoker pack`"
        ) from exc


def _missing_directory(directory: str) -> str | None:
    """What to say when a local pack directory does not exist at all (a mistyped path), with
    the closest name beside it; None for a directory that exists, or a remote one."""
    if "://" in directory or not directory or os.path.exists(directory):
        return None
    above = os.path.dirname(directory.rstrip("/")) or "."
    try:
        beside = [e.name for e in os.scandir(above) if e.is_dir()] if os.path.isdir(above) else []
    except OSError:
        beside = []
    close = difflib.get_close_matches(os.path.basename(directory.rstrip("/")), beside, n=1)
    hint = f" (did you mean {os.path.join(above, close[0])}?)" if close else ""
    return (f"{directory}: no such directory{hint}. A pack is the directory `stoker pack` "
            f"wrote (holding {MANIFEST_NAME} and its .tar shards)")


def _parse_manifest(raw: bytes, path: str) -> Manifest:
    try:
        manifest = json.loads(raw)
        if manifest.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"format is {manifest.get('format')!r}")
        base = parent(path)
        shards = [
            TarShard(join(base, s["path"]), int(s["samples"]), int(s["size_bytes"]))
            for s in manifest["shards"]
        ]
        tables = manifest.get("tables")
        return Manifest(shards, dict(manifest.get("meta", {})),
                        join(base, tables) if tables else None,
                        int(manifest.get("tables_bytes", 0)))
    except (ValueError, KeyError, TypeError) as exc:
        raise ShardError(
            f"{path}: not a stoker shard manifest ({type(exc).__name__}: {exc}); expected the "
            f"{MANIFEST_NAME} that `stoker pack` writes, or pass the list of shard paths instead"
        ) from exc


def read_tables(source: ByteSource, manifest: Manifest) -> list[ShardTable]:
    """Every shard's index from the manifest's file of them, one per listed shard."""
    assert manifest.tables is not None
    data = manifest.tables_data
    tables = tables_from_bytes(read_fresh(source, manifest.tables) if data is None else data,
                               manifest.tables)
    if len(tables) != len(manifest.shards):
        raise ShardError(
            f"{manifest.tables}: indexes of {len(tables)} shards, the manifest lists "
            f"{len(manifest.shards)}: the two were not written by the same pack; pack again")
    return tables


def size_mismatch(path: str, actual: int, table: ShardTable,
                  samples: int | None = None) -> ShardError:
    """The error for a shard whose size (or sample count) is not what its index says."""
    listed = "" if samples is None else f" and the manifest {samples} samples"
    return ShardError(
        f"{path}: the shard is {actual} bytes and its index has {len(table)} samples; the "
        f"index says {table.size_bytes} bytes{listed}: the shard changed or was truncated "
        "after it was indexed; re-create it (stoker pack redoes an unfinished shard)"
    )


def expect_contents(source: ByteSource, tables: dict[str, ShardTable]) -> None:
    """Tell a caching source what each shard's content is (a digest of its index), so no
    cached copy of other content is read for it (NOTE [ Cached copies named by their
    content ] in ``storage/cache.py``)."""
    expect_versions = extra(source, ByteSourceExtras.expect_versions)
    if expect_versions is not None and tables:
        expect_versions({path: table.digest() for path, table in tables.items()})


def expect_manifest_sizes(source: ByteSource, shards: list[TarShard]) -> None:
    """Tell a source that takes them the shards' sizes the manifest gives, so no request asks
    them one by one (``RemoteSource.expect_sizes``)."""
    expect_sizes = extra(source, ByteSourceExtras.expect_sizes)
    if expect_sizes is not None:
        expect_sizes({s.path: s.size_bytes for s in shards})


def manifest_path(path: str) -> str | None:
    """The manifest a path names (itself, or ``index.json`` in it), or None for one shard."""
    if path.endswith(".json"):
        return path
    if path.endswith((".tar", ".tgz")) or ".tar." in posixpath.basename(path):
        return None  # a shard, compressed ones included: the scan says what they are
    return posixpath.join(path.rstrip("/"), MANIFEST_NAME)
