"""stoker.formats.checksum: zlib-ng's CRC-32 when installed, the standard library's otherwise,
with the same values (NOTE [ CRC-32 speed ])."""

from __future__ import annotations

import importlib
import random
import sys
import zlib

import pytest

from stoker.formats import checksum


@pytest.mark.parametrize("size", [0, 1, 7, 5 * 1024 + 1, 12_700, 1 << 20])
def test_the_same_checksum_as_zlib_for_bytes_views_and_a_running_value(size: int) -> None:
    data = random.Random(size).randbytes(size)
    assert checksum.crc32(data) == zlib.crc32(data)
    view = memoryview(data)[size // 3 : size - size // 5]  # how the scan passes members
    assert checksum.crc32(view) == zlib.crc32(view)
    assert checksum.crc32(data, 0xDEADBEEF) == zlib.crc32(data, 0xDEADBEEF)


def test_zlib_ng_is_used_when_installed() -> None:
    zlib_ng = pytest.importorskip("zlib_ng.zlib_ng")
    assert checksum.crc32 is zlib_ng.crc32


def test_without_zlib_ng_the_standard_library_computes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "zlib_ng", None)  # an import of it now fails
    monkeypatch.delitem(sys.modules, "zlib_ng.zlib_ng", raising=False)
    try:
        assert importlib.reload(checksum).crc32 is zlib.crc32
    finally:
        monkeypatch.undo()
        importlib.reload(checksum)
