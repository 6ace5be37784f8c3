"""``crc32``: the CRC-32 that tar shard indexes record per member, from zlib-ng when it is
installed (the ``fastcrc`` extra), else from the standard library's zlib. Both compute the same
checksum (zlib's polynomial); only the speed differs.

NOTE [ CRC-32 speed ]
Each sample read from a tar shard is checked against its index (``verify_crc``, on by default),
each member packed gets one, and the stream checks a shard whole before yielding from it. The
standard library's zlib (1.2.13 here) took 3.2 us for a 12.7 KB JPEG (~4 GB/s), a third of the
~10 us of reading that sample from a cached shard; zlib-ng's took 0.29 us (~44 GB/s, SIMD),
measured with ``timeit`` on this machine. zlib-ng is an extra, not a requirement: its wheels
cover the usual platforms, and a missing one only costs this time.
"""

from __future__ import annotations

try:
    from zlib_ng.zlib_ng import crc32
except ImportError:  # the standard library's: the same values, ~11x slower
    from zlib import crc32

__all__ = ["crc32"]
