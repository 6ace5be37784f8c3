"""Unusual tensors and arrays come back from workers as torch's do, or as the dataset made them.

With ``collate_fn`` returning the samples unchanged: by default a batch from two workers is
what torch's workers give (its transport by construction: torch's own workers lose the
conjugate and negative bits of lazy views, and turn big-endian arrays native); with
``slab_transport`` it equals the samples themselves: values, dtype, layout, type,
requires_grad, what ``num_workers=0`` gives.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

import numpy as np
import pytest
import torch

import stoker

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # nested tensors: prototype


def _samples(i: int) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nested = torch.nested.nested_tensor([torch.arange(2.0) + i, torch.arange(3.0)])
    return {
        "nested": nested,
        "sparse_coo": torch.sparse_coo_tensor([[0, 2]], [1.0, float(i)], (3,)),
        "sparse_csr": (torch.eye(3) * i).to_sparse_csr(),
        "parameter": torch.nn.Parameter(torch.ones(2) * i),
        "requires_grad": torch.ones(2, requires_grad=True),
        "conj_view": torch.tensor([1 + 2j * i]).conj(),
        "neg_view": torch.tensor([1.0, float(i)])._neg_view(),
        "strided_view": torch.arange(10.0 + i)[::3],
        "expanded": torch.ones(1).expand(5),
        "bfloat16": torch.full((3,), i, dtype=torch.bfloat16),
        "empty_uint16": torch.empty(0, dtype=torch.uint16),
        "scalar_bool": torch.tensor(bool(i % 2)),
        "object_array": np.array(["a", None, i], dtype=object),
        "structured_array": np.array([(i, 0.5)], dtype=[("a", "i4"), ("b", "f8")]),
        "big_endian_array": np.arange(3, dtype=">i4") + i,
        "non_contiguous_array": (np.arange(12).reshape(3, 4) + i)[:, ::2],
    }


class _Kinds(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> dict[str, Any]:
        return _samples(i)


def _as_is(batch: list) -> list:
    return batch


def _same(expected: Any, actual: Any) -> bool:
    if isinstance(expected, np.ndarray):
        return (type(actual) is np.ndarray and actual.dtype == expected.dtype
                and actual.tolist() == expected.tolist())
    assert isinstance(expected, torch.Tensor)
    if (type(actual) is not type(expected) or actual.dtype != expected.dtype
            or actual.layout != expected.layout or actual.is_nested != expected.is_nested
            or actual.requires_grad != expected.requires_grad):
        return False
    if expected.is_nested:
        return all(torch.equal(a, e) for a, e in zip(actual.unbind(), expected.unbind(),
                                                     strict=True))
    if expected.layout != torch.strided:
        return torch.equal(actual.to_dense(), expected.to_dense())
    return torch.equal(actual.resolve_conj().resolve_neg(),
                       expected.resolve_conj().resolve_neg())


def test_samples_from_workers_are_torchs_by_default():
    def load(loader_class: Any) -> list:
        return list(loader_class(_Kinds(), batch_size=2, num_workers=2, collate_fn=_as_is,
                                 timeout=60))

    expected, actual = load(torch.utils.data.DataLoader), load(stoker.DataLoader)
    for b, (torch_batch, batch) in enumerate(zip(expected, actual, strict=True)):
        for j, (want, sample) in enumerate(zip(torch_batch, batch, strict=True)):
            wrong = [k for k in want if not _same(want[k], sample[k])]
            assert not wrong, f"sample {2 * b + j}: {wrong} differ from torch's"
    assert not _same(expected[0][0]["neg_view"], _samples(0)["neg_view"])  # torch's loss


@pytest.mark.parametrize(("num_workers", "beyond"), [(0, None), (2, {"slab_transport"})])
def test_samples_come_back_as_made(num_workers, beyond):
    loader = stoker.DataLoader(_Kinds(), batch_size=2, num_workers=num_workers,
                               collate_fn=_as_is, timeout=60 if num_workers else 0,
                               beyond_torch=beyond)
    batches = list(loader)
    assert len(batches) == 3
    for b, batch in enumerate(batches):
        for j, sample in enumerate(batch):
            expected = _samples(2 * b + j)
            wrong = [k for k in expected if not _same(expected[k], sample[k])]
            assert not wrong, f"sample {2 * b + j}: {wrong} differ"
    # Nothing keeps a batch alive once the user drops it (a rebuilt sparse tensor once sat
    # in torch's list of tensors to validate, and so did its slab).
    del batches, batch, sample, loader
    gc.collect()
    with open("/proc/self/maps") as maps:
        assert not [line for line in maps if "stoker-slab" in line]


def test_default_collate_refuses_nested_tensors_like_torch():
    class Nested(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int) -> torch.Tensor:
            return _samples(i)["nested"]

    with pytest.raises(RuntimeError) as torch_error:
        list(torch.utils.data.DataLoader(Nested(), batch_size=2))
    with pytest.raises(RuntimeError) as stoker_error:
        list(stoker.DataLoader(Nested(), batch_size=2, num_workers=2, timeout=60))
    assert str(stoker_error.value).startswith(str(torch_error.value))
