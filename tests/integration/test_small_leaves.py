"""NOTE [ Small leaves do not hold the slab ]: a loop that keeps only each batch's labels keeps
only the labels, as under torch, not every batch's images (measured as PSS of the process tree,
main process and workers: shared pages are split between the processes that map them)."""

from __future__ import annotations

import psutil
import torch
from torch.utils.data import Dataset

_IMAGE = (3, 96, 96)  # 27 KiB of uint8 per sample; a batch of 64: 1.7 MiB
_HELD_BATCHES = 120  # ~200 MiB of images if every batch's slab stayed alive


class Images(Dataset):
    def __len__(self) -> int:
        return 64 * (_HELD_BATCHES + 8)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full(_IMAGE, i % 251, dtype=torch.uint8), i % 10


def _tree_pss_bytes() -> int:
    me = psutil.Process()
    total = 0
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return total


def test_holding_only_labels_does_not_hold_the_images(Loader):
    loader = Loader(Images(), batch_size=64, num_workers=2, timeout=60)
    labels = []
    it = iter(loader)
    for _ in range(8):  # warm: the workers' slabs (or torch's segments) exist
        images, y = next(it)
        labels.append(y)
    del images
    before = _tree_pss_bytes()
    for images, y in it:
        labels.append(y)
        del images
    grown_mib = (_tree_pss_bytes() - before) / 2**20
    assert len(labels) == _HELD_BATCHES + 8
    assert torch.cat(labels).tolist() == [i % 10 for i in range(64 * (_HELD_BATCHES + 8))]
    # torch: a few MiB (its own bookkeeping); keeping every slab would be ~200 MiB.
    assert grown_mib < 40, f"the process tree grew by {grown_mib:.0f} MiB for 60 KiB of labels"
