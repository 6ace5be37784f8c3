"""``pack``: a directory of files or a map-style dataset -> tar shards + index, in parallel.

NOTE [ Resumable pack ]
    The output directory holds a plan (``pack.json``: what is packed, how many samples, how
    many per shard, the re-encoding) written before any shard. Shard ``k`` always holds samples
    ``k*S .. (k+1)*S - 1``, so any process can write any shard and a shard's bytes do not depend
    on which process wrote it or when. A shard is written as ``<name>.partial``, flushed to
    disk and renamed; then its sidecar index is written the same way. A shard is finished iff
    its sidecar exists and names the shard's size: that is the last thing written, so a shard
    killed anywhere before it is redone from scratch (its leftovers are deleted), and a
    finished one is never touched again. Every shard's index is then copied into one file
    (``index.tables.npz``: one read for a remote reader) and the manifest (``index.json``) is
    written last, so a directory with a manifest is complete. Running the same pack again
    resumes; running a different one into the same directory is refused.

NOTE [ Ctrl-C in a pack ]
    Ctrl-C reaches the driver and its workers (one process group). A worker writing a shard
    stops at once (``KeyboardInterrupt`` from its handler): its ``.partial`` file is removed
    and the stop flag set, so shards still queued stop before their first sample; an idle
    worker ignores it (no traceback from the pool's queue). The driver cancels what is
    pending, waits for its workers and raises ``PackInterrupted`` (a ``KeyboardInterrupt``)
    saying how many shards are finished and kept; the command prints it and exits 130.
    Running the same pack again resumes (NOTE [ Resumable pack ]).

NOTE [ A pack stopped by a bad sample ]
    A sample that cannot be packed (an unreadable file, the dataset's exception, a broken key
    rule) stops the pack at once: pending shards are cancelled and running ones stop at their
    next sample (a flag after the shared counts, set by the failing worker; their ``.partial``
    files are removed), so the error comes in seconds, not after every other shard. Finished
    shards are kept: fixing the sample and running the same pack again resumes. Removing it
    instead renumbers every later sample, which a resume would mix with shards numbered
    before: the plan's sample count changes and the pack is refused, so the error says so up
    front. A worker that died (killed, out of memory) breaks the pool: stopped the same way,
    and a rerun resumes.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import mmap
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.errors import PackError
from stoker.formats._common import write_atomic
from stoker.formats._records import (
    RESAMPLE_RULE,
    DatasetRecords,
    FolderRecords,
    Records,
    packed_record,
)
from stoker.formats.pack_report import (
    PackSummary,
    Progress,
    interrupted_error,
    plan_differences,
    stopped_error,
    verify_pack,
)
from stoker.formats.pack_writer import (
    DEFAULT_JPEG_QUALITY,
    _Stopped,
    init_worker,
    shard_meta,
    shard_name,
    write_shard,
)
from stoker.formats.tar_index import (
    INDEX_SUFFIX,
    TABLES_NAME,
    ShardTable,
    index_path,
    tables_to_bytes,
)
from stoker.formats.tar_manifest import MANIFEST_FORMAT, MANIFEST_NAME, MANIFEST_VERSION

PLAN_NAME = "pack.json"
SIZE_PROBE_SAMPLES = 16


@dataclass(frozen=True)
class PackOptions:
    """How ``pack`` writes shards. ``samples_per_shard`` wins over ``shard_size_mb`` (a target
    turned into a sample count from the mean size of the first samples). ``workers``: processes
    (default: the CPU count). ``max_side``: re-encode larger images (jpg, png, webp, bmp, tif,
    ppm fields) so their longer side is at most this, recorded in the metadata (NOTE [ Resizing
    with --max-side ] in ``_records``). ``jpeg_quality``: of re-encoded images and of PIL
    images and uint8 arrays a Dataset gives under jpg/webp. ``fields``: names of a tuple
    sample's elements. ``progress``: a progress line on stderr (default: when it is a terminal).
    """

    samples_per_shard: int | None = None
    shard_size_mb: float = 256.0
    workers: int | None = None
    max_side: int | None = None
    jpeg_quality: int = DEFAULT_JPEG_QUALITY
    fields: tuple[str, ...] | None = None
    verify: bool = False
    progress: bool | None = None
    name: str = "shard"

    def __post_init__(self) -> None:
        for field_name in ("samples_per_shard", "workers", "max_side"):
            value = getattr(self, field_name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{field_name}={value!r}: expected a positive int or None")
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality={self.jpeg_quality!r}: expected 1 to 100")
        if not self.shard_size_mb > 0:
            raise ValueError(f"shard_size_mb={self.shard_size_mb!r}: expected more than 0")
        if not self.name or "/" in self.name:
            raise ValueError(f"name={self.name!r}: expected a file name prefix such as 'shard'")


def _records(source: Any, options: PackOptions) -> Records:
    if isinstance(source, (str, os.PathLike)):
        if not os.path.exists(source):
            raise FileNotFoundError(
                f"{source}: no such directory; stoker pack reads an image folder (one "
                "subdirectory per class) or a map-style Dataset"
            )
        if not os.path.isdir(source):
            raise FileNotFoundError(
                f"{source}: not a directory; stoker pack reads an image folder (one "
                "subdirectory per class) or a map-style Dataset"
            )
        return FolderRecords(os.fspath(source))
    if not hasattr(source, "__getitem__") or not hasattr(source, "__len__"):
        raise TypeError(
            f"cannot pack a {type(source).__name__}: stoker pack needs a directory or a "
            "map-style Dataset (with __len__ and __getitem__)"
        )
    return DatasetRecords(source, options.fields, type(source).__qualname__)


def check_out_dir(source: Any, out_dir: str) -> None:
    """Refuse an output directory that cannot hold this pack (a file; inside the image folder
    ``source`` packs), before any work."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise FileExistsError(
            f"{out_dir} is a file, not a directory; the output of stoker pack is a directory "
            "of shards: give a new or empty directory"
        )
    if isinstance(source, (str, os.PathLike)):
        root, out = os.path.realpath(source), os.path.realpath(out_dir)
        if os.path.commonpath([root, out]) == root:
            raise PackError(
                f"{out_dir} is inside the image folder {source}: the pack would become part "
                "of what it packs (a class directory, or files listed next time); pack into a "
                "directory outside it"
            )


def _plan(records: Records, options: PackOptions) -> dict[str, Any]:
    n = len(records)
    per_shard = options.samples_per_shard
    if per_shard is None:  # measured as written: after --max-side
        probe = [packed_record(records, i, options.max_side, options.jpeg_quality)[1]
                 for i in range(min(n, SIZE_PROBE_SAMPLES))]
        mean = sum(sum(len(v) + 1024 for v in r.values()) for r in probe) / max(1, len(probe))
        per_shard = max(1, int(options.shard_size_mb * 2**20 // max(mean, 1)))
    encodes = options.max_side or isinstance(records, DatasetRecords)  # PIL images, arrays
    plan = {
        "version": 1, "source": records.describe(), "samples": n,
        "samples_per_shard": per_shard, "shards": -(-n // per_shard) if n else 0,
        "max_side": options.max_side,
        "jpeg_quality": options.jpeg_quality if encodes else None,
        "name": options.name,
    }
    if options.max_side:
        plan["resample"] = RESAMPLE_RULE
    return plan


def _settle_plan(out_dir: str, plan: dict[str, Any], options: PackOptions) -> dict[str, Any]:
    """The plan to follow: the one on disk when it packs the same thing (resume), else ours."""
    path = os.path.join(out_dir, PLAN_NAME)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        derived = ("samples_per_shard", "shards")  # from a size probe, unless given
        if options.samples_per_shard is None and all(
            old.get(k) == v for k, v in plan.items() if k not in derived
        ):
            plan = {**plan, **{k: old.get(k) for k in derived}}
        if old != plan:
            changed = plan_differences(old, plan, options.samples_per_shard is not None)
            raise FileExistsError(
                f"{out_dir} holds a pack of something else or with other options (its "
                f"{PLAN_NAME} -> this pack): {'; '.join(changed)}. "
                "Run the pack with the same source and options to resume it, pack into another "
                "directory, or delete this one to start over"
            )
        return old
    names = sorted(n for n in os.listdir(out_dir) if not n.startswith("."))
    if MANIFEST_NAME in names:
        raise FileExistsError(
            f"{out_dir} holds a finished pack ({MANIFEST_NAME}, {len(names)} files) but not its "
            f"plan {PLAN_NAME}, so stoker pack cannot tell what it packed: read it as it is "
            f"(stoker.formats.TarShards({out_dir!r})), or delete the directory or pack into "
            "another one to pack again"
        )
    if names:
        more = f" and {len(names) - 5} more" if len(names) > 5 else ""
        raise FileExistsError(
            f"{out_dir} is not empty and holds no {PLAN_NAME}, so it is no pack to resume "
            f"(found {names[:5]}{more}); pack into a new or empty directory, or remove these files"
        )
    write_atomic(path, json.dumps(plan, indent=1).encode())
    return plan


def _finished(out_dir: str, plan: dict[str, Any], k: int) -> ShardTable | None:
    shard = os.path.join(out_dir, shard_name(plan, k))
    if not os.path.exists(index_path(shard)) or not os.path.exists(shard):
        return None
    with open(index_path(shard), "rb") as f:
        table = ShardTable.from_bytes(f.read(), index_path(shard))
    return table if table.size_bytes == os.path.getsize(shard) else None


def _written_table(out_dir: str, plan: dict[str, Any], k: int) -> ShardTable:
    """The index of shard ``k``, which this pack has just written."""
    table = _finished(out_dir, plan, k)
    if table is None:
        raise RuntimeError(f"{out_dir}: a shard written by this pack is missing or changed "
                           "(another process writing the same directory?); run it again")
    return table


def _clean(out_dir: str, plan: dict[str, Any], k: int) -> None:
    shard = os.path.join(out_dir, shard_name(plan, k))
    for path in (shard, shard + ".partial", index_path(shard), index_path(shard) + ".partial"):
        if os.path.exists(path):
            os.remove(path)


# -- the driver -------------------------------------------------------------------------------


def pack(source: Any, out_dir: str, options: PackOptions | None = None, **overrides: Any
         ) -> PackSummary:
    """Pack ``source`` (an image-folder directory or a map-style Dataset) into tar shards with
    an index in ``out_dir``; resumes an interrupted pack of the same source (NOTE [ Resumable
    pack ]). Keyword arguments override fields of ``options`` (``PackOptions``)."""
    options = dataclasses.replace(options or PackOptions(), **overrides)
    started = time.perf_counter()
    check_out_dir(source, out_dir)
    records = _records(source, options)
    wanted = _plan(records, options)
    os.makedirs(out_dir, exist_ok=True)
    plan = _settle_plan(out_dir, wanted, options)
    done = {k: t for k in range(plan["shards"]) if (t := _finished(out_dir, plan, k))}
    todo = [k for k in range(plan["shards"]) if k not in done]
    for k in todo:
        _clean(out_dir, plan, k)
    resumed = sum(len(t) for t in done.values())
    progress = Progress(plan["samples"], resumed, options.progress)
    try:
        written = _run(records, plan, out_dir, todo, progress, options.workers)
    except (PackError, BrokenProcessPool) as exc:
        kept = sum(1 for k in range(plan["shards"]) if _finished(out_dir, plan, k))
        raise stopped_error(exc, out_dir, (kept, plan["shards"]), plan["source"]["kind"]
                            ) from exc
    except KeyboardInterrupt:  # NOTE [ Ctrl-C in a pack ]
        kept = sum(1 for k in range(plan["shards"]) if _finished(out_dir, plan, k))
        raise interrupted_error(out_dir, (kept, plan["shards"])) from None
    finally:
        progress.close()
    tables = [done.get(k) or _written_table(out_dir, plan, k) for k in range(plan["shards"])]
    _write_manifest(out_dir, plan, tables)
    summary = PackSummary(
        out_dir, sum(len(t) for t in tables), len(tables), sum(t.size_bytes for t in tables),
        time.perf_counter() - started, len(done), sum(n for n, _ in written.values()),
    )
    if options.verify:
        summary = dataclasses.replace(summary, verified=verify_pack(out_dir, options.workers))
    return summary


def _run(records: Records, plan: dict[str, Any], out_dir: str, todo: list[int],
         progress: Progress, workers: int | None) -> dict[int, tuple[int, int]]:
    if not todo:
        return {}
    workers = max(1, min(_workers(workers), len(todo)))
    fork = sys.platform == "linux"
    context = mp.get_context("fork" if fork else None)
    # Samples written so far, per shard, in an anonymous shared mapping forked workers inherit
    # (no file, no semaphore), and after them the stop flag (NOTE [ A pack stopped by a bad
    # sample ]); elsewhere progress moves a shard at a time.
    shared = mmap.mmap(-1, 8 * (plan["shards"] + 1)) if fork else None
    counts = np.frombuffer(shared, dtype=np.int64) if shared is not None else None
    written: dict[int, tuple[int, int]] = {}
    with cf.ProcessPoolExecutor(
        workers, mp_context=context, initializer=init_worker,
        initargs=(records, plan, out_dir, counts),
    ) as pool:
        pending = {pool.submit(write_shard, k) for k in todo}
        try:
            while pending:
                finished, pending = cf.wait(pending, timeout=0.25,
                                            return_when=cf.FIRST_COMPLETED)
                errors = [e for f in finished if (e := f.exception()) is not None]
                for error in errors:  # the failing shard's, not one it stopped (any order)
                    if not isinstance(error, _Stopped):
                        raise error
                for future in finished:
                    if future.exception() is None:
                        k, n, size = future.result()
                        written[k] = (n, size)
                done = int(counts[:-1].sum()) if counts is not None else sum(
                    n for n, _ in written.values())
                progress.update(done, sum(s for _, s in written.values()))
        except BaseException:
            if counts is not None:
                counts[-1] = 1
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return written


def _workers(requested: int | None) -> int:
    return requested or os.cpu_count() or 1


def _write_manifest(out_dir: str, plan: dict[str, Any], tables: list[ShardTable]) -> None:
    """Every shard's index in one file, then the manifest naming it (written last: NOTE
    [ Resumable pack ])."""
    all_tables = tables_to_bytes(tables)
    write_atomic(os.path.join(out_dir, TABLES_NAME), all_tables)
    manifest = {
        "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION,
        "samples": sum(len(t) for t in tables), "index_suffix": INDEX_SUFFIX,
        "tables": TABLES_NAME, "tables_bytes": len(all_tables),
        "shards": [
            {"path": shard_name(plan, k), "samples": len(t), "size_bytes": t.size_bytes}
            for k, t in enumerate(tables)
        ],
        "meta": shard_meta(plan),
    }
    write_atomic(os.path.join(out_dir, MANIFEST_NAME), json.dumps(manifest, indent=1).encode())
