"""Contract-test fixtures: the integration suite's leak check, run around every contract test,
and the ``seeding`` a resume test runs under.

The contract tests start worker processes, so each one must leave no child process, thread,
file descriptor or ``/dev/shm`` entry behind. The check itself lives in
``tests/integration/conftest.py`` (see its docstring); it is loaded from there under a private
module name rather than copied, so both suites apply the same rules.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from stoker._core import beyond_torch

_PATH = Path(__file__).resolve().parent.parent / "integration" / "conftest.py"
_spec = importlib.util.spec_from_file_location("_stoker_contract_leak_check", _PATH)
assert _spec is not None and _spec.loader is not None, f"cannot load the leak check from {_PATH}"
_leak_check = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _leak_check  # dataclasses look their module up there
_spec.loader.exec_module(_leak_check)

no_leaks = _leak_check.no_leaks  # autouse: every test in this directory is checked


@pytest.fixture(params=["per_batch", "default"])
def seeding(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a resume test under explicit per-batch seeding (``"per_batch"``: the loaders name
    ``seeding="per_batch"``) and under the default, torch's per-worker seeding (``"default"``:
    they name none, and ``STOKER_BEYOND_TORCH`` is cleared so the default is torch's). Under the
    default the loader factories seed ``random``, numpy and torch first, as a script does at
    its start: with ``num_workers=0`` the samples draw from those (NOTE [ Main streams
    resume ]), so the reference, the saving run and every resumed run must start alike."""
    monkeypatch.delenv(beyond_torch.ENV, raising=False)
    return str(request.param)
