"""Parquet and Arrow files (what Hugging Face ``datasets`` stores) as map-style datasets, read
with ``pyarrow`` (the ``parquet`` extra).

``ParquetDataset``: row ``i`` is found from the files' row-group sizes (read from the footers
at open) and read by decoding its row group; each process keeps the last row groups it decoded
(``cache_row_groups``), so a sequential or shard-ordered pass decodes each group once, while a
fully shuffled pass over groups larger than the cache decodes a group per row: shuffle within
groups (small row groups, or a sampler that visits one group at a time) when that matters.

``ArrowDataset``: Arrow IPC files, file or stream format (``datasets``' cache files are the
stream format), memory-mapped when local (zero copy), read whole through the source otherwise.

Rows are dicts ``{column: Python value}`` (``transform`` applies to them).
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from stoker.formats._common import SourceFile, default_source, require
from stoker.storage import ByteSource


def _paths(paths: str | Sequence[str]) -> list[str]:
    out = [paths] if isinstance(paths, str) else list(paths)
    if not out:
        raise ValueError("no files given: pass a path or a list of paths")
    return out


class _RowIndex:
    """Global row -> (part, row within part) over parts of known lengths."""

    def __init__(self, lengths: Sequence[int]) -> None:
        self.ends = np.cumsum(np.asarray(lengths, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def find(self, index: int) -> tuple[int, int]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"row index {index} out of range for {n} rows")
        index %= n
        part = int(np.searchsorted(self.ends, index, side="right"))
        return part, index - (int(self.ends[part - 1]) if part else 0)


def _row(table: Any, j: int) -> dict[str, Any]:
    return {name: table.column(name)[j].as_py() for name in table.column_names}


class ParquetDataset(Dataset[Any]):
    """Rows of Parquet files, by index. ``columns``: read only these."""

    def __init__(
        self,
        paths: str | Sequence[str],
        *,
        columns: Sequence[str] | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        source: ByteSource | None = None,
        cache_row_groups: int = 2,
    ) -> None:
        require("pyarrow.parquet", "parquet", "stoker.formats.ParquetDataset")
        self.paths = _paths(paths)
        self.source = default_source(self.paths[0], source)
        self.columns = list(columns) if columns is not None else None
        self.transform, self.cache_row_groups = transform, cache_row_groups
        self._files: dict[int, Any] = {}
        self._cache: OrderedDict[tuple[int, int], Any] = OrderedDict()
        self._lock = threading.Lock()
        self.groups: list[tuple[int, int]] = []  # (file, row group)
        lengths = []
        for f in range(len(self.paths)):
            metadata = self._file(f).metadata
            self._check_columns(f)
            for g in range(metadata.num_row_groups):
                self.groups.append((f, g))
                lengths.append(metadata.row_group(g).num_rows)
        self._rows = _RowIndex(lengths)

    def _file(self, f: int) -> Any:
        handle = self._files.get(f)
        if handle is None:
            pq = require("pyarrow.parquet", "parquet", "stoker.formats.ParquetDataset")
            local = self.source.local_path(self.paths[f])
            target = local if local is not None else io.BufferedReader(
                SourceFile(self.source, self.paths[f]), 1 << 20)
            handle = self._files[f] = pq.ParquetFile(target, memory_map=local is not None)
        return handle

    def _check_columns(self, f: int) -> None:
        """A column asked for that file ``f`` lacks is named now: pyarrow reads the others
        and says nothing (a typo would give every row without it)."""
        names = self._file(f).schema_arrow.names
        missing = [c for c in self.columns or () if c not in names]
        if missing:
            raise ValueError(
                f"{self.paths[f]}: no column {', '.join(map(repr, missing))}; its columns are "
                f"{names}: fix columns= (or leave it out to read them all)"
            )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()  # open files and decoded groups stay in their process
        state.update(_files={}, _cache=OrderedDict(), _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def _group(self, part: int) -> Any:
        with self._lock:  # one decode per group, however many threads ask
            table = self._cache.get(self.groups[part])
            if table is None:
                f, g = self.groups[part]
                table = self._file(f).read_row_group(g, columns=self.columns)
                self._cache[self.groups[part]] = table
                while len(self._cache) > max(1, self.cache_row_groups):
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(self.groups[part])
            return table

    def __getitem__(self, index: int) -> Any:
        part, j = self._rows.find(index)
        row = _row(self._group(part), j)
        return row if self.transform is None else self.transform(row)


class ArrowDataset(Dataset[Any]):
    """Rows of Arrow IPC files (file or stream format), by index."""

    def __init__(
        self,
        paths: str | Sequence[str],
        *,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        source: ByteSource | None = None,
    ) -> None:
        require("pyarrow", "parquet", "stoker.formats.ArrowDataset")
        self.paths = _paths(paths)
        self.source = default_source(self.paths[0], source)
        self.transform = transform
        self._tables: dict[int, Any] = {}
        self._rows = _RowIndex([self._table(f).num_rows for f in range(len(self.paths))])

    def _table(self, f: int) -> Any:
        table = self._tables.get(f)
        if table is None:
            pa = require("pyarrow", "parquet", "stoker.formats.ArrowDataset")
            ipc = require("pyarrow.ipc", "parquet", "stoker.formats.ArrowDataset")
            local = self.source.local_path(self.paths[f])
            buffer = pa.memory_map(local) if local is not None else pa.py_buffer(
                self.source.read(self.paths[f]))
            try:
                table = ipc.open_file(buffer).read_all()
            except pa.ArrowInvalid:  # not the file format: the stream format
                if local is not None:
                    buffer.seek(0)
                table = ipc.open_stream(buffer).read_all()
            self._tables[f] = table
        return table

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tables": {}}  # each process maps the files itself

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int) -> Any:
        f, j = self._rows.find(index)
        row = _row(self._table(f), j)
        return row if self.transform is None else self.transform(row)
