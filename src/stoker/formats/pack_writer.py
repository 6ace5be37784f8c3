"""``pack``'s shard writer, run in its worker processes: shard ``k``'s samples into a tar
written aside and renamed, then its sidecar index (NOTE [ Resumable pack ] in ``pack.py``);
Ctrl-C and a failing sample stop it at once (NOTE [ Ctrl-C in a pack ], NOTE [ A pack stopped
by a bad sample ])."""

from __future__ import annotations

import contextlib
import os
import signal
import tarfile
import threading
import time
from typing import Any

from stoker.errors import PackError
from stoker.formats._common import write_atomic
from stoker.formats._records import Records, packed_record
from stoker.formats.tar_index import index_path, scan_shard
from stoker.storage import LocalSource

DEFAULT_JPEG_QUALITY = 90


def shard_name(plan: dict[str, Any], k: int) -> str:
    return f"{plan['name']}-{k:06d}.tar"


def shard_meta(plan: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"source": plan["source"]}
    if plan["max_side"]:
        meta["max_side"] = plan["max_side"]
        meta["jpeg_quality"] = plan["jpeg_quality"]
        meta["resample"] = plan["resample"]
    return meta


_JOB: dict[str, Any] = {}


def init_worker(records: Records, plan: dict[str, Any], out_dir: str, counts: Any) -> None:
    _JOB.update(records=records, plan=plan, out_dir=out_dir, counts=counts, writing=False)
    signal.signal(signal.SIGINT, _interrupt_a_shard)  # NOTE [ Ctrl-C in a pack ]
    parent = os.getppid()
    threading.Thread(target=_exit_with, args=(parent,), name="stoker-pack-parent-watch",
                     daemon=True).start()


def _interrupt_a_shard(signum: int, frame: Any) -> None:
    """NOTE [ Ctrl-C in a pack ]"""
    if _JOB.get("writing"):
        raise KeyboardInterrupt


def _exit_with(parent: int) -> None:
    """A pool worker whose driver died (kill -9, OOM) would wait on its task queue forever:
    the queue's write end lives on in the worker's siblings. Leave once the parent is gone;
    its unfinished shard is redone by the next run (NOTE [ Resumable pack ])."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


class _Stopped(Exception):
    """Another shard failed: this one stopped (NOTE [ A pack stopped by a bad sample ])."""


def write_shard(k: int) -> tuple[int, int, int]:
    """Write shard ``k`` (NOTE [ Resumable pack ]); returns (k, samples, bytes)."""
    plan, out_dir = _JOB["plan"], _JOB["out_dir"]
    shard = os.path.join(out_dir, shard_name(plan, k))
    start = k * plan["samples_per_shard"]
    indices = range(start, min(plan["samples"], start + plan["samples_per_shard"]))
    _JOB["writing"] = True
    try:
        return _write_whole_shard(k, shard, indices)
    finally:
        _JOB["writing"] = False


def _write_whole_shard(k: int, shard: str, indices: range) -> tuple[int, int, int]:
    plan = _JOB["plan"]
    try:
        with open(shard + ".partial", "wb") as f:
            _write_samples(f, k, indices)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as exc:
        if _JOB["counts"] is not None and not isinstance(exc, _Stopped):
            _JOB["counts"][-1] = 1  # stop the other shards now, not when the driver hears
        with contextlib.suppress(FileNotFoundError):
            os.remove(shard + ".partial")
        raise
    os.replace(shard + ".partial", shard)
    table = scan_shard(LocalSource(), shard, shard_meta(plan))
    if len(table) != len(indices):  # samples merged or lost on read: never index such a shard
        os.remove(shard)
        raise PackError(
            f"{shard}: {len(indices)} samples written, but reading it back finds {len(table)}; "
            "the shard is removed. Their keys or field names break the rules of NOTE [ Keys "
            "and fields in a tar ] in a way stoker pack did not catch: please report it"
        )
    write_atomic(index_path(shard), table.to_bytes())
    return k, len(table), table.size_bytes


def _write_samples(f: Any, k: int, indices: range) -> None:
    records, plan, counts = _JOB["records"], _JOB["plan"], _JOB["counts"]
    quality = plan["jpeg_quality"] or DEFAULT_JPEG_QUALITY
    previous = None
    with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for index in indices:
            if counts is not None and counts[-1]:
                raise _Stopped
            key, fields = packed_record(records, index, plan["max_side"], quality)
            if key == previous:
                raise PackError(
                    f"{records.where(index)}: its __key__ {key!r} is the key of sample "
                    f"{index - 1} too, and adjacent samples with one key read back as one "
                    "sample; give every sample its own key"
                )
            previous = key
            for name, data in fields.items():
                _add_member(tar, f"{key}.{name}", data)
            if counts is not None:  # one slot per shard: one writer, no lock
                counts[k] += 1


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    import io

    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0  # same bytes on every run
    tar.addfile(info, io.BytesIO(data))
