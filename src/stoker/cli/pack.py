"""``stoker pack SOURCE OUT``: an image folder or a map-style Dataset -> tar shards + index.

Imports ``stoker.formats`` only when the command runs (``stoker --help`` stays fast).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _quality(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be 1 to 100, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "pack",
        help="pack an image folder or a map-style Dataset into tar shards with an index",
        description=(
            "Write SOURCE (an image-folder directory, one subdirectory per class, or "
            "MODULE:FACTORY, a function returning a map-style Dataset) as WebDataset-style tar "
            "shards with a sidecar index per shard and a manifest (OUT/index.json), in "
            "parallel. Run it again after an interruption to resume: finished shards are kept."
            " Read the result with stoker.formats.TarShards(OUT)."
        ),
    )
    parser.add_argument("source", metavar="SOURCE", help="a directory or MODULE:FACTORY")
    parser.add_argument("out", metavar="OUT", help="output directory (new, or a pack to resume)")
    parser.add_argument("--samples-per-shard", type=_positive, default=None, metavar="N",
                        help="samples in each shard (default: from --shard-size-mb)")
    parser.add_argument(
        "--shard-size-mb", type=_positive_float, default=256.0, metavar="MB",
        help="target shard size when --samples-per-shard is not given (default 256)",
    )
    parser.add_argument("--workers", type=_positive, default=None,
                        help="processes (default: the CPU count)")
    parser.add_argument("--max-side", type=_positive, default=None, metavar="PIXELS",
                        help="re-encode larger images (jpg, png, webp, bmp, tif, ppm) so "
                        "their longer side is at most this: bicubic, nearest-neighbour for "
                        "label images (palette or integer modes, or png/bmp/tif fields named "
                        "like seg.png); EXIF and ICC profiles kept, animations left as they are")
    parser.add_argument("--jpeg-quality", type=_quality, default=90, metavar="1..100",
                        help="JPEG/WebP quality of re-encoded images and of a Dataset's PIL "
                        "images and arrays (default 90)")
    parser.add_argument("--fields", default=None, metavar="EXT,EXT",
                        help="field names of a Dataset's tuple samples, e.g. jpg,cls")
    parser.add_argument("--verify", action="store_true",
                        help="re-read every shard afterwards and check counts and CRC-32s")
    parser.add_argument("--no-progress", action="store_true", help="no progress line")


def _load_dataset(spec: str) -> Any:
    """The dataset ``spec`` names; ``UserCodeFailed`` when the user's code raises."""
    from stoker.doctor.factory import call_factory, import_factory

    try:
        factory = import_factory(spec, "a map-style Dataset")
    except ValueError as exc:
        raise SystemExit(f"stoker pack: {exc} SOURCE is a directory or MODULE:FUNCTION.") from exc
    return call_factory(factory, spec)


def _run(args: argparse.Namespace) -> int:
    from stoker.doctor.factory import UserCodeFailed
    from stoker.errors import PackError
    from stoker.formats import PackOptions, ShardError, pack
    from stoker.formats.pack import check_out_dir

    source: Any = args.source
    try:  # before the user's code runs: the output directory's own problems
        check_out_dir(source if os.path.isdir(source) else None, args.out)
    except (PackError, FileExistsError) as exc:
        print(f"stoker pack: {exc}", file=sys.stderr)
        return 1
    if not os.path.isdir(source) and ":" in source:
        try:
            source = _load_dataset(source)
        except UserCodeFailed as exc:
            print(f"{exc.traceback_text}stoker pack: {exc}", file=sys.stderr)
            return 1
    options = PackOptions(
        samples_per_shard=args.samples_per_shard, shard_size_mb=args.shard_size_mb,
        workers=args.workers, max_side=args.max_side, jpeg_quality=args.jpeg_quality,
        fields=tuple(args.fields.split(",")) if args.fields else None, verify=args.verify,
        progress=False if args.no_progress else None,
    )
    try:
        summary = pack(source, args.out, options)
    except (PackError, ShardError, FileExistsError, FileNotFoundError) as exc:
        print(f"stoker pack: {exc}", file=sys.stderr)
        return 1
    print(summary)
    return 0


def run(args: argparse.Namespace) -> int:
    """``stoker pack``; Ctrl-C says how to resume and exits 130 (NOTE [ Ctrl-C in a pack ])."""
    from stoker.errors import PackInterrupted
    from stoker.formats.pack_report import INTERRUPTED

    try:
        return _run(args)
    except KeyboardInterrupt as exc:
        told = str(exc) if isinstance(exc, PackInterrupted) else INTERRUPTED
        print(f"stoker pack: {told}", file=sys.stderr)
        return 130
