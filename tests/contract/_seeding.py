"""What a resume test's loader factory passes for the ``seeding`` fixture's value
(``conftest.seeding``)."""

from __future__ import annotations

import random

import numpy as np
import torch


def seeding_kwargs(seeding: str) -> dict[str, str]:
    """``"default"``: no argument (torch's seeding), after seeding ``random``, numpy and torch
    as a script does at its start; else ``seeding=`` that value."""
    if seeding != "default":
        return {"seeding": seeding}
    random.seed(1234)
    np.random.seed(1234)
    torch.manual_seed(1234)
    return {}
