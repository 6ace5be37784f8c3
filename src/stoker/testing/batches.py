"""How ``stoker.testing`` compares batches: exactly, with the first difference named."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch


def same_batches(expected: Sequence[Any], got: Sequence[Any]) -> None:
    """Same batches in the same order, leaf by leaf; ``AssertionError`` names the first one
    that differs and where."""
    __tracebackhide__ = True
    for i, (exp, act) in enumerate(zip(expected, got, strict=False)):
        diff = first_difference(exp, act, "batch")
        if diff is not None:
            raise AssertionError(f"batch {i} (of {len(expected)}): {diff}")
    if len(expected) != len(got):
        raise AssertionError(
            f"expected {len(expected)} batches, got {len(got)}"
            + (f"; the first extra batch is {_short(got[len(expected)])}"
               if len(got) > len(expected) else "")
        )


def same_batches_any_order(expected: Sequence[Any], got: Sequence[Any]) -> None:
    """The same batches, each exactly once, in any order (for ``in_order=False``).

    Both sides are sorted by a digest of their content, then compared with ``same_batches``;
    the batch index in a message is the index in that sorted order.
    """
    __tracebackhide__ = True
    if len(expected) != len(got):
        raise AssertionError(f"expected {len(expected)} batches, got {len(got)}")
    try:
        same_batches(sorted(expected, key=content_key), sorted(got, key=content_key))
    except AssertionError as exc:
        raise AssertionError(f"(batches sorted by content) {exc}") from None


def content_key(value: Any) -> str:
    """A digest of ``value``'s content; equal values (``first_difference`` is None) share it."""
    digest = hashlib.blake2b(digest_size=16)
    _feed(digest, value)
    return digest.hexdigest()


def _feed(digest: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        digest.update(f"T{value.dtype}{tuple(value.shape)}".encode())
        if value.dtype == torch.bfloat16:
            value = value.view(torch.int16)
        digest.update(value.contiguous().numpy().tobytes())
    elif isinstance(value, np.ndarray):
        digest.update(f"A{value.dtype}{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).tobytes() if value.dtype != object
                      else repr(value.tolist()).encode())
    elif isinstance(value, Mapping):
        digest.update(f"M{type(value).__name__}{len(value)}".encode())
        for key in sorted(value, key=repr):
            digest.update(repr(key).encode())
            _feed(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"S{type(value).__name__}{len(value)}".encode())
        for item in value:
            _feed(digest, item)
    else:
        digest.update(f"V{type(value).__name__}:{value!r}".encode())


def first_difference(expected: Any, got: Any, path: str = "value") -> str | None:
    """``None`` when equal (recursively and exactly; NaN equals NaN), else where they differ."""
    if isinstance(expected, torch.Tensor) or isinstance(got, torch.Tensor):
        return _tensor_difference(expected, got, path)
    if isinstance(expected, np.ndarray) or isinstance(got, np.ndarray):
        if not (isinstance(expected, np.ndarray) and isinstance(got, np.ndarray)):
            return f"{path}: expected {_short(expected)}, got {_short(got)}"
        return _array_difference(expected, got, path)
    if type(expected) is not type(got):
        return f"{path}: expected a {type(expected).__name__}, got a {type(got).__name__}"
    if isinstance(expected, Mapping):
        if list(expected) != list(got):
            return f"{path}: expected keys {list(expected)}, got {list(got)}"
        for key in expected:
            diff = first_difference(expected[key], got[key], f"{path}[{key!r}]")
            if diff is not None:
                return diff
        return None
    if isinstance(expected, (list, tuple)):
        if len(expected) != len(got):
            return f"{path}: expected length {len(expected)}, got {len(got)}"
        for i, (a, b) in enumerate(zip(expected, got, strict=True)):
            diff = first_difference(a, b, f"{path}[{i}]")
            if diff is not None:
                return diff
        return None
    if isinstance(expected, float) and math.isnan(expected) and math.isnan(got):
        return None
    try:
        equal = bool(expected == got)
    except Exception as exc:  # an __eq__ that returns something without a truth value
        return f"{path}: cannot compare {type(expected).__name__} values ({exc})"
    return None if equal else f"{path}: expected {_short(expected)}, got {_short(got)}"


def _array_difference(expected: np.ndarray, got: np.ndarray, path: str) -> str | None:
    if expected.dtype != got.dtype or expected.shape != got.shape:
        return (f"{path}: expected an array of dtype {expected.dtype} and shape "
                f"{expected.shape}, got dtype {got.dtype} and shape {got.shape}")
    differs = np.asarray(expected != got, dtype=bool)
    if expected.dtype.kind in "fc":
        differs &= ~(np.isnan(expected) & np.isnan(got))
    if not differs.any():
        return None
    where = tuple(int(i) for i in np.argwhere(differs)[0])
    return (f"{path}: arrays of shape {expected.shape} first differ at index {where}: "
            f"expected {expected[where]!r}, got {got[where]!r} "
            f"({int(differs.sum())} element(s) differ)")


def _tensor_difference(expected: Any, got: Any, path: str) -> str | None:
    if not (isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor)):
        return f"{path}: expected {_short(expected)}, got {_short(got)}"
    if expected.dtype != got.dtype or expected.shape != got.shape:
        return (f"{path}: expected a tensor of dtype {expected.dtype} and shape "
                f"{tuple(expected.shape)}, got dtype {got.dtype} and shape {tuple(got.shape)}")
    a, b = expected.detach().cpu(), got.detach().cpu()
    differs = a != b
    if a.is_floating_point() or a.is_complex():
        differs &= ~(torch.isnan(a) & torch.isnan(b))
    if not bool(differs.any()):
        return None
    where = tuple(int(i) for i in differs.nonzero()[0])
    return (f"{path}: tensors of shape {tuple(a.shape)} first differ at index {where}: "
            f"expected {a[where].item()!r}, got {b[where].item()!r} "
            f"({int(differs.sum())} element(s) differ)")


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def non_plain_path(value: Any, path: str) -> str:
    """Where the first value that JSON cannot hold sits in a state dict."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path}[{key!r}] (a non-string key)"
            found = non_plain_path(item, f"{path}[{key!r}]")
            if found:
                return found
        return ""
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = non_plain_path(item, f"{path}[{i}]")
            if found:
                return found
        return ""
    if value is None or isinstance(value, (str, int, float, bool)):
        return ""
    return f"{path} (a {type(value).__name__})"


