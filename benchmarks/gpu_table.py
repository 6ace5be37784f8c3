"""The tables of docs/gpu_feed.md's "Measured" section, rendered from a record of
``benchmarks/gpu_feed.py`` (issue 46).

    python benchmarks/gpu_table.py gpu-results/gpu_feed.json                 # print them
    python benchmarks/gpu_table.py gpu-results/gpu_feed.json --write docs/gpu_feed.md

``--write`` replaces what lies between the page's ``<!-- gpu-record: begin -->`` and
``<!-- gpu-record: end -->`` lines. ``FIGURES`` is the record's ``figures``: every leaf a number
from the run, or ``None`` where its part did not get there (``missing_figures`` lists those).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

BEGIN, END = "<!-- gpu-record: begin -->", "<!-- gpu-record: end -->"

DECODE = {
    "torch_pillow": "(a) torch's DataLoader, Pillow + `RandomResizedCrop` in `__getitem__`",
    "stoker_image_path": "(b) stoker's image path, `decode_crop_into` in `__getitem__`",
    "decode_images_loader": "(c) `DecodeImages` on the GPU through stoker's loader",
    "decode_images_bare": "`DecodeImages` on the GPU, bare loop (no loader)",
    "torchvision_bare": "(d) torchvision's batched `decode_jpeg(device=\"cuda\")`, bare loop",
}
_WORKERS = ("torch_pillow", "stoker_image_path", "decode_images_loader")
FEED = {"image_uint8": ("image_batch", "uint8"), "tokens_int64": ("token_batch", "int64")}
FEED_LOADERS = {"feed_only": "stoker's feed alone, pre-made pinned batches (no workers)",
                "host_only": "host batches only, no copy (what the workers deliver)",
                "stoker": "stoker `device=`", "stoker_best": "`device=`, `beyond_torch=True`",
                "torch": "torch, `pin_memory=True` + `.to()`"}
STEP = {"torch": "torch's DataLoader, Pillow in `__getitem__` (its best `num_workers`)",
        "stoker_image_path": "stoker's image path, `device=`",
        "stoker_gpu_decode": "stoker, `device=` + `DecodeImages` (decode on the GPU)"}

# The record's figures, every leaf required:
# {section: {entry: {field: (the part, the figure it emitted, that figure's key)}}}.
_D = {k: "decode_gpu" for k in ("decode_images_loader", "decode_images_bare", "torchvision_bare")}
_D.update(torch_pillow="decode_torch", stoker_image_path="decode_stoker")
FIGURES: dict[str, dict[str, dict[str, tuple[str, str, str]]]] = {
    "decode": {k: {"images_per_s": (_D[k], k, "images_per_s"),
                   "cpu_s_per_image": (_D[k], k, "cpu_s_per_image"),
                   **({"num_workers": (_D[k], k, "num_workers")} if k in _WORKERS else {}),
                   **({"decoder": (_D[k], k, "decoder")} if k == "stoker_image_path" else {})}
               for k in DECODE},
    "feed": {shape: {"plain_batches_per_s": ("feed", f"{shape}.plain", "batches_per_s"), **{
        f"{kind}_{key}": ("feed", f"{shape}.{kind}", key) for kind in FEED_LOADERS
        for key in ("batches_per_s", "share_of_plain")}} for shape in FEED},
    "step": {"resident": {"step_s": ("step", "resident", "step_s"),
                          "model": ("step", "resident", "model")},
             **{k: {key: ("step", k, key) for key in ("step_s", "ratio_to_resident",
                                                       "num_workers")}
                for k in STEP}},
}


def figures_of(emitted: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """``FIGURES`` filled in from what the parts emitted ({part: {figure: values}})."""
    return {section: {entry: {field: emitted.get(part, {}).get(name, {}).get(key)
                              for field, (part, name, key) in fields.items()}
                      for entry, fields in entries.items()}
            for section, entries in FIGURES.items()}


def missing_figures(figures: dict[str, Any]) -> list[str]:
    """The dotted names of the figures the record lacks (``None`` or absent)."""
    return [f"{section}.{entry}.{field}"
            for section, entries in FIGURES.items() for entry, fields in entries.items()
            for field in fields
            if figures.get(section, {}).get(entry, {}).get(field) is None]


def _n(value: Any, fmt: str = ",.0f", scale: float = 1.0) -> str:
    if value is None:
        return "n/a"
    return format(value * scale if scale != 1.0 else value, fmt)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def render(record: dict[str, Any]) -> str:
    """The "Measured" section's text: the run's line, then its decode, feed and step tables."""
    fig, sizes, machine = record["figures"], record.get("sizes", {}), record.get("machine", {})
    side = sizes.get("out", 224)
    failed = [f"{name} ({p['status']})" for name, p in record.get("parts", {}).items()
              if p.get("status") != "ok"]
    lines = [
        f"{record.get('date', '?')[:10]}, {machine.get('device', '?')} "
        f"({machine.get('cores', '?')} cores, torch {machine.get('torch', '?')}, torchvision "
        f"{machine.get('torchvision') or 'none'}), `{record.get('command', '?')}`"
        + (" (a dry run: the fake device, no figure worth reading)" if record.get("dry_run")
           else "") + ("; parts not completed: " + ", ".join(failed) if failed else "") + ".",
        "",
    ]
    decoder = fig["decode"]["stoker_image_path"].get("decoder")
    labels = {**DECODE, "stoker_image_path": DECODE["stoker_image_path"] + (
        f" ({decoder})" if decoder else "")}
    decode = [[labels[k], _n(fig["decode"][k].get("num_workers"), "d") if k in _WORKERS else "",
               _n(fig["decode"][k]["images_per_s"]),
               _n(fig["decode"][k]["cpu_s_per_image"], ".2f", 1000)]
              for k in DECODE]
    lines += _table([f"decode, {sizes.get('width', 500)}x{sizes.get('height', 375)} JPEGs to "
                     f"{side}x{side}", "workers", "images/s", "CPU ms per image"], decode)
    feed = []
    for shape, (size_key, dtype) in FEED.items():
        f = fig["feed"][shape]
        dims = "x".join(map(str, sizes.get(size_key, [])))
        feed.append([f"{dims} {dtype}", _n(f["plain_batches_per_s"], ",.1f")] + [
            f"{_n(f[f'{k}_batches_per_s'], ',.1f')} ({_n(f[f'{k}_share_of_plain'], '.2f')})"
            for k in FEED_LOADERS])
    lines += ["", *_table(["batches/s delivered on the GPU (share of the plain loop)",
                           "plain pinned-copy loop", *FEED_LOADERS.values()], feed)]
    resident = fig["step"]["resident"]
    step = [[label, _n(fig["step"][k]["num_workers"], "d"),
             _n(fig["step"][k]["step_s"], ".1f", 1000),
             _n(fig["step"][k]["ratio_to_resident"], ".3f")] for k, label in STEP.items()]
    lines += ["", *_table([
        f"{resident.get('model') or 'ResNet-50'} step from the JPEG files (bf16, channels_last, "
        f"batch {sizes.get('batch', 256)})", "workers", "step ms",
        f"ratio to a resident batch ({_n(resident['step_s'], '.1f', 1000)} ms)"], step)]
    return "\n".join(lines + ["", *(f"- {line}" for line in verdicts(fig))])


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if a is not None and b else None


def _goal(value: float | None, ok: bool | None, goal: str) -> str:
    met = "n/a" if value is None else ("met" if ok else "not met")
    return f"(goal {goal}: {met})"


def verdicts(fig: dict[str, Any]) -> list[str]:
    """The issue's goals, and what one GPU's decode is worth in cores, from the figures."""
    d, feed, step = fig["decode"], fig["feed"]["image_uint8"], fig["step"]
    loader_share = _ratio(d["decode_images_loader"]["images_per_s"],
                          d["torchvision_bare"]["images_per_s"])
    per_core = {k: _ratio(d[k]["images_per_s"], d[k]["num_workers"])
                for k in ("torch_pillow", "stoker_image_path")}
    gpu = d["decode_images_loader"]["images_per_s"]
    share, best = feed["stoker_share_of_plain"], feed["stoker_best_share_of_plain"]
    ratios = [step[k]["ratio_to_resident"] for k in ("stoker_image_path", "stoker_gpu_decode")]
    stoker_best = min((r for r in ratios if r is not None), default=None)
    return [
        f"`DecodeImages` through stoker's loader: {_n(loader_share, '.2f')} of torchvision's "
        f"bare batched loop {_goal(loader_share, (loader_share or 0) >= 0.8, '>= 0.8')}.",
        f"Per core: torch + Pillow {_n(per_core['torch_pillow'])} images/s, stoker's image "
        f"path {_n(per_core['stoker_image_path'])}; one GPU decoding through stoker's loader "
        f"does the work of {_n(_ratio(gpu, per_core['stoker_image_path']), '.1f')} cores on the "
        f"image path ({_n(_ratio(gpu, per_core['torch_pillow']), '.1f')} with torch + Pillow).",
        f"`device=` on the image batch: {_n(share, '.2f')} of the plain pinned-copy loop "
        f"{_goal(share, (share or 0) >= 0.9, '>= 0.9')}; with `beyond_torch=True` "
        f"{_n(best, '.2f')}.",
        f"The step from JPEG files with stoker's best setting: {_n(stoker_best, '.3f')} of the "
        f"resident step {_goal(stoker_best, (stoker_best or 9) <= 1.05, '<= 1.05')}; torch's "
        f"DataLoader {_n(step['torch']['ratio_to_resident'], '.3f')}.",
    ]


def write(page: str, text: str) -> str:
    """``page`` with what lies between its BEGIN and END lines replaced by ``text``."""
    head, found, rest = page.partition(BEGIN + "\n")
    _, found_end, tail = rest.partition(END)
    if not found or not found_end:
        raise ValueError(f"the page has no {BEGIN} ... {END} lines to write between")
    return f"{head}{BEGIN}\n{text}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("record")
    parser.add_argument("--write", metavar="PAGE")
    args = parser.parse_args(argv)
    with open(args.record) as f:
        text = render(json.load(f))
    if args.write:
        with open(args.write) as f:
            page = f.read()
        with open(args.write, "w") as f:
            f.write(write(page, text))
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
