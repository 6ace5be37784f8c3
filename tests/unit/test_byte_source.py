"""LocalSource: whole and ranged reads of real files, and a clear error on a short read."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from stoker.storage import ByteSource, LocalSource


def test_local_source_reads_whole_and_ranges(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)) * 4)
    source = LocalSource()
    assert isinstance(source, ByteSource)
    assert source.size(str(path)) == 1024
    assert source.read(str(path)) == bytes(range(256)) * 4
    expected = bytes([250, 251, 252, 253, 254, 255, 0, 1, 2, 3])
    assert source.read_range(str(path), 250, 10) == expected
    assert source.local_path(str(path)) == str(path)
    assert isinstance(pickle.loads(pickle.dumps(source)), LocalSource)


def test_local_source_short_read_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "short.bin"
    path.write_bytes(b"abcdef")
    with pytest.raises(OSError) as info:
        LocalSource().read_range(str(path), 4, 10)
    assert str(info.value) == (
        f"{path}: asked for 10 bytes at offset 4, the file has 2 there (it is 6 bytes long); "
        "the file changed or was truncated after its index was built: rebuild the index"
    )
