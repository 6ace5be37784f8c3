"""The same small dataset written in every format stoker reads, with the format's own writer
(tarfile via ``stoker pack``, pyarrow, lmdb, tfrecord, image files), and each reader's
transform to one common sample: ``tensor([index, len(payload), payload[0]])``, so a lost,
repeated or garbled sample shows in any test."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

N = 23


def payload(i: int) -> bytes:
    return bytes([i]) * (i % 7 + 1)


def common(index: int, data: bytes) -> torch.Tensor:
    return torch.tensor([index, len(data), data[0]])


def from_tar(s: dict[str, Any]) -> torch.Tensor:
    return common(int(s["cls"]), s["bin"])


def from_row(row: dict[str, Any]) -> torch.Tensor:
    return common(row["index"], row["data"])


def from_tf(f: dict[str, Any]) -> torch.Tensor:
    return common(int(f["index"][0]), f["data"])


def from_lmdb(value: bytes) -> torch.Tensor:
    return common(value[0], value[1:])


def from_image(item: tuple[bytes, int]) -> torch.Tensor:
    from PIL import Image

    data, label = item
    with Image.open(io.BytesIO(data)) as image:
        index = image.size[0] - 1  # image i is (i + 1) pixels wide
    return torch.tensor([index, label, 0])


class _Records(torch.utils.data.Dataset[dict[str, Any]]):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"bin": payload(i), "cls": i}


def write_all(root: str) -> dict[str, Callable[[], Any]]:
    """Write every format under ``root``; name -> factory of its reader (map-style)."""
    import lmdb
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image
    from tfrecord.tools.tfrecord2idx import create_index
    from tfrecord.writer import TFRecordWriter

    from stoker import formats

    formats.pack(_Records(), f"{root}/tar", samples_per_shard=5, workers=1, progress=False)
    rows = {"index": list(range(N)), "data": [payload(i) for i in range(N)]}
    table = pa.table(rows)
    pq.write_table(table.slice(0, 10), f"{root}/a.parquet", row_group_size=3)
    pq.write_table(table.slice(10), f"{root}/b.parquet", row_group_size=4)
    with pa.ipc.new_stream(f"{root}/data.arrow", table.schema) as writer:  # HF datasets' form
        writer.write_table(table, max_chunksize=6)
    for part, span in (("a", range(0, 12)), ("b", range(12, N))):
        writer = TFRecordWriter(f"{root}/{part}.tfrecord")
        for i in span:
            writer.write({"index": (i, "int"), "data": (payload(i), "byte")})
        writer.close()
        create_index(f"{root}/{part}.tfrecord", f"{root}/{part}.tfrecord.index")
    env = lmdb.open(f"{root}/db", map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i in range(N):
            txn.put(f"{i:04d}".encode(), bytes([i]) + payload(i))
    env.close()
    for i in range(N):
        cls = f"{root}/images/c{i % 3}"
        os.makedirs(cls, exist_ok=True)
        Image.fromarray(np.zeros((2, i + 1, 3), np.uint8)).save(f"{cls}/{i:03d}.png")
    return readers(root)


def readers(root: str) -> dict[str, Callable[[], Any]]:
    """name -> factory of the reader over what ``write_all(root)`` wrote."""
    from stoker import formats

    return {
        "tar": lambda: formats.TarShards(f"{root}/tar", transform=from_tar),
        "parquet": lambda: formats.ParquetDataset(
            [f"{root}/a.parquet", f"{root}/b.parquet"], transform=from_row),
        "arrow": lambda: formats.ArrowDataset(f"{root}/data.arrow", transform=from_row),
        "tfrecord": lambda: formats.TFRecordDataset(
            [f"{root}/a.tfrecord", f"{root}/b.tfrecord"], transform=from_tf),
        "lmdb": lambda: formats.LMDBDataset(f"{root}/db", transform=from_lmdb),
        "image_folder": lambda: formats.ImageFolder(
            f"{root}/images", decode="bytes", transform=None, target_transform=None),
    }


READERS = ["tar", "parquet", "arrow", "tfrecord", "lmdb", "image_folder"]


class _ImageAsTensor(torch.utils.data.Dataset[torch.Tensor]):
    """The image folder's (bytes, label) as the tensor sample the other readers give."""

    def __init__(self, folder: Any) -> None:
        self.folder = folder

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int) -> torch.Tensor:
        return from_image(self.folder[i])


def tensor_reader(factories: dict[str, Callable[[], Any]], name: str) -> Any:
    """Reader ``name``, its samples as tensors [index, length or label, index or 0]."""
    dataset = factories[name]()
    return _ImageAsTensor(dataset) if name == "image_folder" else dataset


def expected(name: str) -> list[list[int]]:
    """What each reader's samples are, in its own order."""
    if name == "image_folder":  # classes sorted, then files: c0 holds 0, 3, 6, ...
        order = sorted(range(N), key=lambda i: (i % 3, i))
        return [[i, i % 3, 0] for i in order]
    return [[i, len(payload(i)), i] for i in range(N)]


def sample_of(name: str, dataset: Any, i: int) -> list[int]:
    item = dataset[i]
    if name == "image_folder":
        item = from_image(item)
    return [int(x) for x in item]
