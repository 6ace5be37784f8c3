"""tests/_optional.py: a test module's optional dependencies are checked without importing
them, and a missing one skips the module with its reason."""

from __future__ import annotations

import sys

import pytest

from _optional import installed, skip_module_unless


def test_a_missing_module_skips_with_its_reason() -> None:
    with pytest.raises(pytest.skip.Exception, match="could not import 'no_such_module_x': why"):
        skip_module_unless(("pytest", "never"), ("no_such_module_x", "why"))


def test_an_installed_module_is_found_without_being_imported() -> None:
    name = "tabnanny"  # in the standard library, imported by nothing in this suite
    if name in sys.modules:
        pytest.skip(f"{name} was imported by another test in this process")
    assert installed(name)
    skip_module_unless((name, "never"))
    assert name not in sys.modules


def test_a_submodule_is_refused() -> None:
    with pytest.raises(ValueError, match="top-level module"):
        skip_module_unless(("moto.server", "the S3 server"))
