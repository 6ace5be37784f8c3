"""GPU tests: every test here is marked ``gpu`` and skipped, with the reason, without CUDA
(CI has none). They check what the fake device cannot: the real CUDA calls."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = str(config.rootpath / "tests" / "gpu")
    skip = pytest.mark.skip(reason=f"needs CUDA (torch {torch.__version__}, "
                                   f"torch.cuda.is_available() is False)")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)
