"""The layer table of src/stoker/README.md holds: a module imports stoker modules only from its
own layer and below (imports inside functions included), apart from the hooks listed here."""

from __future__ import annotations

import ast
from pathlib import Path

import stoker

# Low to high, as in src/stoker/README.md.
LAYERS = [
    ["errors"], ["_core"], ["transport"], ["collate"], ["sampling"], ["sharing"], ["fetch"],
    ["fastpaths"], ["distributed"], ["storage"], ["formats"], ["workers"], ["profile"],
    ["device"], ["image"], ["vision"], ["engine"],
    ["loader", "mix", "testing", "stateful"],
    ["integrations", "doctor", "cli"],
]
# Calls up a layer: none. The doctor attaches to loaders from above (NOTE [ The doctor
# attaches from above ] in stoker/doctor/agent.py).
HOOKS: set[tuple[str, str]] = set()
ROOT = Path(stoker.__file__).parent
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _stoker_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return [n for n in names if n.startswith("stoker.")]


def _layer(part: str) -> str:
    return part.removesuffix(".py")


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = sorted(
        str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
        if _layer(p.relative_to(ROOT).parts[0]) not in RANK | {"__init__": 0, "__main__": 0}
    )
    assert not unplaced, f"add these to the layer table (README and LAYERS here): {unplaced}"


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        own = _layer(rel.parts[0])
        if own not in RANK:
            continue  # the package's __init__ / __main__ gather everything
        for module in _stoker_imports(path):
            target = module.split(".")[1]
            if RANK.get(target, -1) > RANK[own] and (str(rel), module) not in HOOKS:
                upward.append(f"{rel} imports {module}")
    assert not upward, "imports across the layers upwards:\n" + "\n".join(upward)
