"""``TFRecordDataset``: TFRecord files of ``tf.train.Example`` records as a map-style dataset,
with the ``tfrecord`` package (no TensorFlow; the ``tfrecord`` extra) parsing the protobuf.

Random access needs the record index the ``tfrecord`` package defines (a text file of
``offset length`` per record, next to each file as ``<file>.index``; make it with
``python -m tfrecord.tools.tfrecord2idx FILE FILE.index``). Each record is fetched with one
ranged read and its framing checked (the length and both masked CRC-32C fields), so a damaged
file raises ``ShardError`` naming the file and the record instead of a protobuf error.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from stoker.errors import ShardError
from stoker.formats._common import default_source, require
from stoker.storage import ByteSource

INDEX_SUFFIX = ".index"
_WHAT = "stoker.formats.TFRecordDataset"
_TYPES = {"byte": "bytes_list", "float": "float_list", "int": "int64_list"}


def _masked_crc(data: bytes) -> int:
    crc32c = require("crc32c", "tfrecord", _WHAT)
    crc = int(crc32c.crc32c(data))
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class TFRecordDataset(Dataset[Any]):
    """Examples of TFRecord files, by index: dicts ``{feature: value}`` as the ``tfrecord``
    package decodes them (one bytes value, or numpy arrays); ``description`` selects features
    (``{"image": "byte", "label": "int"}`` or a list of names)."""

    def __init__(
        self,
        paths: str | Sequence[str],
        *,
        index_paths: Sequence[str] | None = None,
        description: dict[str, str] | Sequence[str] | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        source: ByteSource | None = None,
    ) -> None:
        require("tfrecord", "tfrecord", _WHAT)
        self.paths = [paths] if isinstance(paths, str) else list(paths)
        if not self.paths:
            raise ValueError("no files given: pass a path or a list of paths")
        self.source = default_source(self.paths[0], source)
        indexes = list(index_paths) if index_paths is not None else [
            p + INDEX_SUFFIX for p in self.paths]
        self.offsets: list[np.ndarray] = [self._read_index(p, i) for p, i in
                                          zip(self.paths, indexes, strict=True)]
        self.description, self.transform = description, transform
        self._ends = np.cumsum([len(o) for o in self.offsets], dtype=np.int64)

    def _read_index(self, path: str, index: str) -> np.ndarray:
        try:
            text = self.source.read(index).decode()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{path}: no record index at {index}; random access needs one: python -m "
                f"tfrecord.tools.tfrecord2idx {path} {index}"
            ) from None
        table = np.array([line.split() for line in text.splitlines() if line.strip()],
                         dtype=np.int64).reshape(-1, 2)
        return table

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def _find(self, index: int) -> tuple[int, int]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"record index {index} out of range for {n} records")
        index %= n
        f = int(np.searchsorted(self._ends, index, side="right"))
        return f, index - (int(self._ends[f - 1]) if f else 0)

    def record(self, index: int) -> bytes:
        """Record ``index``'s serialized bytes, framing checked."""
        f, j = self._find(index)
        path = self.paths[f]
        offset, length = (int(x) for x in self.offsets[f][j])
        try:
            data = self.source.read_range(path, offset, length)
        except OSError as exc:
            raise ShardError(f"{path}: record {j} (sample {index}) could not be read: {exc}"
                             ) from exc
        (size,) = struct.unpack("<Q", data[:8])
        problem = None
        if size + 16 != length:
            problem = f"its length field says {size} bytes, the index {length - 16}"
        elif struct.unpack("<I", data[8:12])[0] != _masked_crc(data[:8]):
            problem = "the CRC of its length does not match"
        elif struct.unpack("<I", data[-4:])[0] != _masked_crc(data[12:-4]):
            problem = "the CRC of its data does not match"
        if problem is not None:
            raise ShardError(
                f"{path}: record {j} (sample {index}, bytes {offset}..{offset + length}) is "
                f"damaged: {problem}; the file or its index changed: re-create them"
            )
        return data[12:-4]

    def __getitem__(self, index: int) -> Any:
        from tfrecord import example_pb2
        from tfrecord.reader import extract_feature_dict

        example = example_pb2.Example()
        example.ParseFromString(self.record(index))
        features = extract_feature_dict(example.features, self.description, _TYPES)
        return features if self.transform is None else self.transform(features)
