"""Under ``torchrun --nproc_per_node 2`` (gloo): a ``shard=True`` loader saved mid-epoch with
``torch.distributed.checkpoint`` and loaded into a fresh loader (whose state has the same keys,
NOTE [ Constant state keys ]) continues with exactly the batches the uninterrupted run had.
Each rank writes ``OUT/rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.utils.data import TensorDataset

import stoker

N, BATCH, SAVE_AFTER = 22, 3, 2


def loader() -> stoker.DataLoader:
    return stoker.DataLoader(
        TensorDataset(torch.arange(N)), batch_size=BATCH, shuffle=True, shard=True,
        generator=torch.Generator().manual_seed(7),
    )


def main(out: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    reference = [b[0].tolist() for b in loader()]
    saving = loader()
    it = iter(saving)
    before = [next(it)[0].tolist() for _ in range(SAVE_AFTER)]
    dcp.save({"loader": saving}, checkpoint_id=f"{out}/ckpt")
    fresh = loader()
    dcp.load({"loader": fresh}, checkpoint_id=f"{out}/ckpt")
    after = [b[0].tolist() for b in fresh]
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"rank": rank, "reference": reference, "before": before, "after": after}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
