"""What ``pack`` tells: the progress line, the summary, the error that stopped it (or what a
refused re-pack changed), and ``verify_pack``'s re-read."""

from __future__ import annotations

import concurrent.futures as cf
import os
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from stoker.errors import PackError, PackInterrupted, ShardError
from stoker.formats.tar_index import load_index, scan_shard
from stoker.formats.tar_manifest import MANIFEST_NAME, Manifest, read_manifest, read_tables
from stoker.storage import LocalSource


@dataclass(frozen=True)
class PackSummary:
    """What a pack wrote: totals over every shard, including shards kept from an interrupted
    run (``shards_kept``); ``packed_samples`` were written by this run, in ``seconds``."""

    out_dir: str
    samples: int
    shards: int
    size_bytes: int
    seconds: float
    shards_kept: int
    packed_samples: int
    verified: bool = False

    @property
    def samples_per_s(self) -> float:
        return self.packed_samples / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        kept = f", {self.shards_kept} kept from an earlier run" if self.shards_kept else ""
        verified = "; verified: every sample re-read, counts and CRC-32s match" if (
            self.verified) else ""
        return (
            f"packed {self.samples} samples into {self.shards} shards{kept} "
            f"({self.size_bytes / 1e6:.1f} MB) in {self.out_dir}: {self.packed_samples} "
            f"samples in {self.seconds:.1f} s, {self.samples_per_s:.0f} samples/s{verified}"
        )


class Progress:
    """One line on stderr, redrawn at most 4 times a second; silent when not enabled."""

    def __init__(self, total: int, already: int, enabled: bool | None) -> None:
        self.total, self.already = total, already
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.started = time.perf_counter()
        self.shown = False

    def update(self, done: int, size_bytes: int) -> None:
        if not self.enabled:
            return
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        count = self.already + done
        percent = 100.0 * count / self.total if self.total else 100.0
        sys.stderr.write(
            f"\rpack: {count}/{self.total} samples ({percent:.0f}%), "
            f"{size_bytes / 1e6:.0f} MB written, {done / elapsed:.0f} samples/s "
        )
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


_SHOWN_ITEMS = 3  # of a list that changed (an image folder's classes): added and removed


def _change(name: str, old: Any, new: Any) -> str:
    if isinstance(old, list) and isinstance(new, list) and len(old) + len(new) > 2 * _SHOWN_ITEMS:
        added = [x for x in new if x not in old]
        removed = [x for x in old if x not in new]
        parts = [f"{len(old)} -> {len(new)}"]
        for word, items in (("added", added), ("removed", removed)):
            if items:
                more = f" and {len(items) - _SHOWN_ITEMS} more" if len(items) > _SHOWN_ITEMS else ""
                parts.append(f"{word} {', '.join(map(repr, items[:_SHOWN_ITEMS]))}{more}")
        if not (added or removed):
            parts.append("the same names in another order")
        return f"{name} {'; '.join(parts)}"
    return f"{name} {old!r} -> {new!r}"


def plan_differences(old: dict[str, Any], new: dict[str, Any], derived_too: bool) -> list[str]:
    """What differs between two plans, each as ``name old -> new``: the source's fields, then
    the options. The shard count follows from the others and is named only when nothing else
    differs; ``samples_per_shard`` is named only when given (``derived_too``), as from a size
    probe it follows from the source and options too."""
    changes = []
    old_source, new_source = old.get("source") or {}, new.get("source") or {}
    for key in [*new_source, *(k for k in old_source if k not in new_source)]:
        if old_source.get(key) != new_source.get(key):
            changes.append(_change(f"source {key}", old_source.get(key), new_source.get(key)))
    skipped = {"source", "shards"} | (set() if derived_too else {"samples_per_shard"})
    if "samples" in old_source or "samples" in new_source:
        skipped.add("samples")  # named with the source
    if old.get("max_side") != new.get("max_side"):
        skipped.add("resample")  # the rule --max-side resizes with: there with it alone
    for key in [*new, *(k for k in old if k not in new)]:
        if key not in skipped and old.get(key) != new.get(key):
            changes.append(_change(key, old.get(key), new.get(key)))
    if not changes:
        changes = [_change(k, old.get(k), new.get(k)) for k in ("samples_per_shard", "shards")
                   if old.get(k) != new.get(k)]
    return changes


INTERRUPTED = "interrupted; run the same command again to resume"


def interrupted_error(out_dir: str, kept: tuple[int, int]) -> PackInterrupted:
    """Ctrl-C stopped the pack: finished shards stay (NOTE [ Resumable pack ] in ``pack``)."""
    return PackInterrupted(
        f"{INTERRUPTED}: {kept[0]} of {kept[1]} shards are finished and kept in {out_dir}"
    )


def stopped_error(cause: BaseException, out_dir: str, kept: tuple[int, int], kind: str
                  ) -> PackError:
    """The error that stopped a pack, with what is kept (finished shards, of all) and how to
    go on (NOTE [ A pack stopped by a bad sample ] in ``pack``)."""
    shards = f"{kept[0]} of {kept[1]} shards are finished and kept in {out_dir}"
    if isinstance(cause, BrokenProcessPool):
        return PackError(
            f"stoker pack was interrupted: a worker process died (killed, or out of memory: "
            f"see dmesg); {shards}: run the same pack again to resume"
        )
    if kind == "image_folder":
        fix, remove = "fix or replace the file, keeping its name", "removing the file"
    else:
        fix, remove = "fix the sample in the dataset", "removing the sample"
    return PackError(
        f"{cause}\n{shards}. To go on, {fix}, and run the same pack again: it resumes. "
        f"{remove.capitalize()} instead renumbers the samples after it, so the pack must "
        "start over in a new or empty directory"
    )


def _verify_shard(path: str) -> str | None:
    """Re-read one shard from scratch with tarfile and compare with its sidecar index."""
    source = LocalSource()
    try:
        fresh = scan_shard(source, path)
        indexed = load_index(source, path)
    except (OSError, ShardError) as exc:
        return str(exc)
    if not fresh.same_as(indexed):
        return (
            f"{path}: its contents ({len(fresh)} samples, {fresh.size_bytes} bytes) differ "
            f"from its index ({len(indexed)} samples, {indexed.size_bytes} bytes, or other "
            "offsets or CRC-32s)"
        )
    return None


def _check_tables(manifest: Manifest) -> list[str]:
    """The file of all indexes (when the manifest names one) against each shard's sidecar."""
    if manifest.tables is None:
        return []
    try:
        tables = read_tables(LocalSource(), manifest)
    except ShardError as exc:
        return [str(exc)]
    return [f"{manifest.tables}: the index of {shard.path} differs from its sidecar"
            for shard, table in zip(manifest.shards, tables, strict=True)
            if not table.same_as(load_index(LocalSource(), shard.path))]


def verify_pack(out_dir: str, workers: int | None = None) -> bool:
    """Re-read every byte of every shard of a pack, independently of its index, and check the
    members, sizes, CRC-32s and counts against the sidecars and the manifest. Returns True, or
    raises ``ShardError`` listing every problem found."""
    manifest = os.path.join(out_dir, MANIFEST_NAME)
    listed = read_manifest(LocalSource(), manifest)
    shards = listed.shards
    problems: list[str] = _check_tables(listed)
    with cf.ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
        # Threads: scanning is zlib (GIL released) and file reads; no dataset code runs.
        found = pool.map(_verify_shard, [s.path for s in shards])
        for shard, problem in zip(shards, found, strict=True):
            if problem is None and os.path.getsize(shard.path) != shard.size_bytes:
                problem = f"{shard.path}: {os.path.getsize(shard.path)} bytes, manifest says " \
                    f"{shard.size_bytes}"
            if problem is None and len(load_index(LocalSource(), shard.path)) != shard.samples:
                problem = f"{shard.path}: sample count differs from the manifest's {shard.samples}"
            if problem is not None:
                problems.append(problem)
    if problems:
        raise ShardError(
            f"{out_dir}: {len(problems)} of {len(shards)} shards failed verification:\n  "
            + "\n  ".join(problems)
            + "\nre-create them: delete those shards and their .idx.npz files and run the same "
            "stoker pack again (it redoes only missing shards)"
        )
    return True
