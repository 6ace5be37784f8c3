"""The `stoker` command. Each subcommand's module is imported only when that command runs,
so `stoker --help` stays fast and a missing optional extra only affects its own command.

    stoker demo [--images N] [--epochs N] [--num-workers N] [--batch-size N] [--rounds N]
                [--packed] [--compare-with MODULE:CLASS]
    stoker pack SOURCE OUT [--samples-per-shard N] [--workers N] [--max-side PX] [--verify]
    stoker doctor [options] MODULE:FACTORY | -- python train.py ...   (cli/doctor.py)
    stoker --version
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

_DEMO_EXTRA = {"PIL": "pillow", "psutil": "psutil"}


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def version_line() -> str:
    """What ``stoker --version`` prints: stoker's version and the versions a bug report needs
    (torch's from its installed metadata: torch is not imported)."""
    import platform
    from importlib import metadata

    from stoker import __version__

    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    return f"stoker {__version__} (torch {torch}, Python {platform.python_version()})"


class _Version(argparse.Action):
    """``--version``, printed without importing torch (nor the loader)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print stoker's, torch's and Python's versions and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        print(version_line())
        parser.exit()


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stoker", description="stoker: a faster, safer drop-in for torch's DataLoader."
    )
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = commands.add_parser(
        "demo",
        help="compare torch's DataLoader and stoker's on a synthetic JPEG dataset",
        description=(
            "Write a small synthetic JPEG dataset to a temporary directory and load it in "
            "tiers, each one change from the last: torch.utils.data.DataLoader over a "
            "torchvision pipeline (ImageFolder + RandomResizedCrop, flip, ToTensor, "
            "Normalize), stoker.DataLoader over the same dataset (the drop-in), the same "
            "pipeline from stoker.vision (one import), a __getitem__ written on stoker's "
            "image path (stoker.image.decode_crop_into) and, with --packed, the files packed "
            "by `stoker pack` and read by TarShards. Prints samples/s, the ratio to torch's, "
            "time to first batch and peak memory (PSS of the process tree) per tier, and "
            "the line that changed. Needs the demo extra: pip install 'stoker[demo]' (the "
            "fastimage extra makes the image path fast; without it Pillow decodes)."
        ),
    )
    demo.add_argument("--images", type=_positive, default=512, help="images (default 512)")
    demo.add_argument("--epochs", type=_positive, default=1, help="epochs each (default 1)")
    demo.add_argument("--num-workers", type=_non_negative, default=2, help="default 2")
    demo.add_argument("--batch-size", type=_positive, default=64, help="default 64")
    demo.add_argument(
        "--rounds", type=_positive, default=3,
        help="runs of each tier, order rotating; medians are shown (default 3)",
    )
    demo.add_argument(
        "--packed", action="store_true",
        help="also pack the files with `stoker pack` and read them with TarShards (tier 4)",
    )
    demo.add_argument(
        "--compare-with",
        default="stoker:DataLoader",
        metavar="MODULE:CLASS",
        help="loader class measured against torch's (default stoker:DataLoader; "
        "torch.utils.data:DataLoader gives an A/A run that shows the noise: then only "
        "tiers 1 and 2 run)",
    )
    commands.add_parser(
        "doctor",
        help="why is my training slow? measure your loader and the settings that help",
        add_help=False,  # stoker.cli.doctor parses its own arguments (and `--` COMMAND)
    ).add_argument("rest", nargs=argparse.REMAINDER)
    from stoker.cli import pack as _pack  # the parser only: formats load when it runs

    _pack.add_parser(commands)
    return parser


def _missing_demo_extra() -> list[str]:
    missing = []
    for module, package in _DEMO_EXTRA.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(package)
    return missing


def _run_demo(args: argparse.Namespace) -> int:
    missing = _missing_demo_extra()
    if missing:
        print(
            f"stoker demo needs {' and '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed. "
            "Install the demo extra: pip install 'stoker[demo]'",
            file=sys.stderr,
        )
        return 2
    from stoker.cli import demo as _demo

    options = _demo.DemoOptions(
        images=args.images,
        epochs=args.epochs,
        num_workers=args.num_workers,
        batch_size=args.batch_size,
        rounds=args.rounds,
        candidate=args.compare_with,
        packed=args.packed,
    )
    return _demo.run_demo(options)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `stoker` console script; returns the exit status. Parsing the
    arguments (``--help``, ``--version``) imports no torch; a Ctrl-C before a command handles
    its own (while torch loads, say) ends it with one line and status 130, no traceback."""
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        print("stoker: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    if argv[:1] == ["doctor"]:
        from stoker.cli import doctor

        return doctor.main(argv[1:])
    args = _build_parser().parse_args(argv)
    if args.command == "demo":
        return _run_demo(args)
    if args.command == "pack":
        from stoker.cli import pack as _pack

        return _pack.run(args)
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse rejects others


if __name__ == "__main__":
    raise SystemExit(main())
