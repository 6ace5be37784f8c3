"""Skip a test module whose optional dependencies are not installed, without importing them.

``pytest.importorskip`` at module level imports the dependency while the suite is collected,
and every pytest process collects every module: each then carried moto, botocore, s3fs, gcsfs
and aiohttp (~80 MiB of a 279 MiB process) from the start, and every worker a test forks
copies its page tables (fork and exit measured 40-47 ms against 36-40 ms without them). Here
only the finders are asked (``importlib.util.find_spec`` of the top-level name): the modules
are imported by the tests that use them, in the process that runs them.

A dependency that is installed but broken now fails its tests instead of skipping them: louder
is right for a test extra.
"""

from __future__ import annotations

import importlib.util

import pytest


def installed(module: str) -> bool:
    """``module`` (a top-level name) can be imported here; nothing is imported."""
    return importlib.util.find_spec(module) is not None


def skip_module_unless(*needs: tuple[str, str]) -> None:
    """At module level: skip the module, with the first missing one's reason, unless every
    ``(top-level module, reason)`` is installed."""
    for module, reason in needs:
        if "." in module:
            raise ValueError(f"{module!r}: name the top-level module (find_spec of a submodule "
                             "imports its package)")
        if not installed(module):
            pytest.skip(f"could not import {module!r}: {reason}", allow_module_level=True)
