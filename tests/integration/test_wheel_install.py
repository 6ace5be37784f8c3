"""The wheel and sdist build, and the wheel installs into a clean virtual environment and runs.

Offline, as CI's test run is: ``python -m build --no-isolation`` uses this environment's
setuptools (the ``dev`` extra), and the clean environment gets torch and numpy from this
environment's site-packages through a ``.pth`` line (installing torch again would download
gigabytes), while stoker itself comes only from the wheel: ``pip install --no-deps
--no-index``. The import is checked to come from the new environment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

import stoker

ROOT = Path(__file__).resolve().parents[2]
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "build", "dist", "*.egg-info", "_build", "bench-results",
    ".pytest_cache", ".mypy_cache", ".ruff_cache",
)
SMOKE = """
import os, sys, torch, stoker
assert stoker.__file__.startswith(sys.prefix), stoker.__file__
dataset = torch.utils.data.TensorDataset(torch.arange(64.0))
loader = stoker.DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2)
assert sorted(torch.cat([b for (b,) in loader]).tolist()) == list(range(64))
print("ok", stoker.__version__)
"""


def _run(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=240,
                          **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{args}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_wheel_installs_into_a_clean_venv_and_runs(tmp_path: Path) -> None:
    pytest.importorskip("build", reason="python -m build needs the dev extra")
    source, dist = tmp_path / "source", tmp_path / "dist"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE)
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, source)

    (sdist,) = dist.glob("stoker-*.tar.gz")
    (wheel,) = dist.glob("stoker-*.whl")
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    for needed in ("LICENSE", "README.md", "CHANGELOG.md", "src/stoker/README.md",
                   "docs/index.md", "docs/conf.py", "benchmarks/run.py"):
        assert needed in names, f"the sdist lacks {needed}"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert "stoker/__init__.py" in names and "stoker/formats/tar_shards.py" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(names)[-8:]

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    purelib = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
                   .stdout.strip())
    (purelib / "_torch_from_the_test_env.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
         "--no-index", wheel)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = _run(python, "-c", SMOKE, cwd=tmp_path, env=env)
    assert done.stdout.split() == ["ok", stoker.__version__]
    assert (env_dir / "bin" / "stoker").exists()
    _run(env_dir / "bin" / "stoker", "--help", cwd=tmp_path, env=env)
