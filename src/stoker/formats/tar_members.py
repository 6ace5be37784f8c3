"""Which members of a tar shard make which samples, by WebDataset's rules, so that stoker and
``webdataset`` read the same samples from the same shards; and what a file that is not a tar
shard looks like, for its error."""

from __future__ import annotations

import re

import numpy as np

from stoker.errors import ShardError

# Copied from webdataset/tariterators.py: ``base_plus_ext`` (no match for a name whose file
# name has no dot or starts with one: README, .jpg, d.x/.hidden.jpg) and
# ``tar_file_iterator``'s ``skip_meta`` (members named ``__name__`` or under ``__name__/``).
_KEY_AND_FIELD = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")
RESERVED = frozenset({"__key__", "__url__"})  # names a sample dict gives its key and shard


def split_name(name: str) -> tuple[str, str] | None:
    """``dir/name.EXT.gz`` -> (``dir/name``, ``ext.gz``): the split is at the first dot of the
    file name and the field lowercased; None for a member WebDataset skips."""
    match = None if _META.match(name) else _KEY_AND_FIELD.match(name)
    return None if match is None else (match.group(1), match.group(2).lower())


# NOTE [ Field names lowercased ]
# WebDataset lowercases a member's extension (``group_by_keys(lcase=True)``): ``a.JPG`` is the
# field "jpg". stoker kept the case before, so an index written by an earlier version (a
# sidecar, an index.tables.npz) may hold "JPG": its field names are lowercased when it is
# loaded (``lowercase_fields``: one pass over the array's code points, no copy when there is
# nothing to lower), so such a pack reads as webdataset reads it and as a new scan indexes it
# (which `stoker pack --verify` compares). A new scan refuses a sample with two members of one
# field (``a.jpg`` twice, or ``a.jpg`` and ``a.JPG``), as webdataset does; one an old index
# lists raises when that sample is read. The members now skipped (README, __meta__/...) stay
# samples in an index built before: rebuild it (``index_shard``, or pack again).


def lowercase_fields(fields: np.ndarray) -> np.ndarray:
    """Field names lowercased as ``str.lower`` does (NOTE [ Field names lowercased ])."""
    if fields.dtype.kind != "U" or fields.size == 0:
        return fields
    points = np.ascontiguousarray(fields).view(np.uint32)
    if not np.any(((points >= ord("A")) & (points <= ord("Z"))) | (points > 127)):
        return fields
    names, codes = np.unique(fields, return_inverse=True)
    return np.array([str(n).lower() for n in names], dtype=str)[codes.reshape(-1)]


def duplicate_field(path: str, sample: int, key: str, field: str) -> ShardError:
    """The error for a sample with two members of one field (NOTE [ Field names lowercased ])."""
    return ShardError(
        f"{path}: sample {sample} (key {key!r}) has the field {field!r} twice (a field is a "
        "member's extension, lowercased; __key__ and __url__ are the sample's own): webdataset "
        "refuses such a shard too (duplicate file name); give each member of a sample its own "
        "extension and re-create the shard"
    )


_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz",
               b"\x28\xb5\x2f\xfd": "zstd"}


def not_a_tar(path: str, head: bytes, exc: Exception) -> ShardError:
    """The error for a file ``tarfile`` cannot open, saying what it looks like by its first
    bytes ``head``."""
    packer = next((name for magic, name in _COMPRESSED.items() if head.startswith(magic)), None)
    if packer is not None:
        what = (f"it is {packer}-compressed; stoker reads uncompressed tar shards (a sample is "
                f"one ranged read): decompress it ({packer} -d) or re-create it uncompressed "
                "(stoker pack)")
    elif head.startswith(b"PK\x03\x04") and path.endswith(".idx.npz"):
        what = (f"it is the index sidecar of {path[: -len('.idx.npz')]}: pass that shard, the "
                "list of shards, or the pack's directory")
    elif head.startswith(b"PK\x03\x04"):
        what = "it is a zip archive; re-create it as a tar (stoker pack)"
    elif not head:
        what = "the file is empty; re-create it (stoker pack redoes an unfinished shard)"
    else:
        what = (f"its first header is not a valid tar header ({exc}): the file is corrupted "
                "or not a tar; re-create it")
    return ShardError(f"{path}: not a tar shard: {what}")
