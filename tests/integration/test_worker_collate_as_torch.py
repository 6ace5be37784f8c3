"""With workers, the default collate gives what torch's workers give, not what it gives inline.

In a worker (``get_worker_info()`` set) torch's ``collate_tensor_fn`` stacks into a shared
``out=`` tensor made from the first sample, so the batch has the first sample's dtype and shape
rule: int32 then int64 gives int32, a dtype the first one cannot hold raises TypeError, a
non-tensor raises AttributeError (``numel``), a later sample smaller than the first raises
"Trying to resize storage that is not resizable". numpy arrays go through the same path
(``torch.as_tensor`` then the tensor collate). NOTE [ Collate in a worker is torch's in-worker
collate ] in ``stoker/collate/_leaves.py``. Each case runs torch's DataLoader and the loader
under test side by side, batched and with ``batch_size=None`` and ``default_collate`` as
``collate_fn`` (one sample's leaves collated).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from _datasets import drop_tracebacks
from torch.utils.data import Dataset, default_collate

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

BIG = 600  # float32 x 600 = 2.4 KiB per sample: the direct stack into the slab

CASES: dict[str, list[Any]] = {
    "int32-int64": [torch.tensor([0], dtype=torch.int32), torch.tensor([1])],
    "int32-int64-wraps": [torch.tensor([1], dtype=torch.int32), torch.tensor([2**40 + 7])],
    "float32-float64": [torch.tensor([0.5]), torch.tensor([1.25], dtype=torch.float64)],
    "int32-float32": [torch.tensor([0], dtype=torch.int32), torch.tensor([1.5])],
    "bool-int64": [torch.tensor([True]), torch.tensor([3])],
    "int64-int32": [torch.tensor([2**40]), torch.tensor([1], dtype=torch.int32)],
    "tensor-float": [torch.tensor([1.0]), 2.0],
    "tensor-numpy-scalar": [torch.tensor([1.0]), np.float32(2.0)],
    "tensor-ndarray": [torch.tensor([1.0]), np.ones(1, np.float32)],
    "shape-13-0": [torch.ones(1, 3), torch.tensor(2.0)],
    "shape-0-13": [torch.tensor(2.0), torch.ones(1, 3)],
    "shape-2-3": [torch.ones(2), torch.ones(3)],
    "big-float32-float64": [torch.zeros(BIG), torch.ones(BIG, dtype=torch.float64)],
    "big-shape-600-300": [torch.zeros(BIG), torch.ones(BIG // 2)],
    "needs-grad": [torch.ones(2, requires_grad=True), torch.ones(2)],
    "dict-int32-int64": [
        {"a": torch.tensor([1], dtype=torch.int32)}, {"a": torch.tensor([2])},
    ],
    "np-int32-int64": [np.array([1], np.int32), np.array([2], np.int64)],
    "np-big-float32-float64": [np.zeros(BIG, np.float32), np.ones(BIG, np.float64)],
    "np-shape-13-scalar": [np.zeros((1, 3), np.float32), np.float32(1.0)],
    "np-shape-13-0": [np.zeros((1, 3), np.float32), np.zeros((), np.float32)],
    "same-dtype": [torch.arange(3), torch.arange(3, 6)],
}


class _Batched(Dataset):
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


class _OneSample(_Batched):
    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> Any:
        return list(self.items)


def _calls_torchs_default_collate(batch: Any) -> Any:
    return torch.utils.data.default_collate(batch)


def _outcome(Loader: type, items: list[Any], mode: str) -> tuple[str, Any]:
    common = {"num_workers": 1, "timeout": 30}
    if mode == "batched":
        loader = Loader(_Batched(items), batch_size=2, **common)
    elif mode == "torch-collate-fn":
        loader = Loader(_Batched(items), batch_size=2, collate_fn=_calls_torchs_default_collate,
                        **common)
    else:
        loader = Loader(_OneSample(items), batch_size=None, collate_fn=default_collate, **common)
    try:
        batch = next(iter(loader))
    except Exception as exc:  # the exception is the result under test
        text = str(exc)
        if "in DataLoader worker process" in text:  # torch's rewrapped worker error
            text = text.rstrip().splitlines()[-1].split(": ", 1)[-1]
        drop_tracebacks(exc)  # so both loaders' workers stop now, not at the next gc
        return "raised", (type(exc), text)
    if isinstance(batch, dict):
        batch = batch["a"]
    return "ok", batch


@pytest.mark.parametrize("mode", ["batched", "unbatched", "torch-collate-fn"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_worker_collate_gives_torchs_worker_result(Loader, TorchLoader, case, mode):
    items = CASES[case]
    kind, ours = _outcome(Loader, items, mode)
    torch_kind, theirs = _outcome(TorchLoader, items, mode)
    assert kind == torch_kind, f"loader: {kind} {ours!r}; torch: {torch_kind} {theirs!r}"
    if kind == "raised":
        assert ours == theirs
        return
    assert type(ours) is type(theirs) is torch.Tensor
    assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape)
    assert torch.equal(ours, theirs)


def test_repro_int32_then_int64(Loader, TorchLoader):
    class DS(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.tensor([i], dtype=torch.int32 if i % 2 == 0 else torch.int64)

    ours = list(Loader(DS(), batch_size=2, num_workers=2, timeout=30))
    theirs = list(TorchLoader(DS(), batch_size=2, num_workers=2, timeout=30))
    assert [b.dtype for b in ours] == [b.dtype for b in theirs] == [torch.int32] * 2
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
