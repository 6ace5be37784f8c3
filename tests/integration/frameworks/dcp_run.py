"""Under ``torchrun --nproc_per_node 2`` (gloo): a ``shard=True`` loader saved mid-epoch with
``torch.distributed.checkpoint`` and loaded into a fresh loader (whose state has the same keys,
NOTE [ Constant state keys ]) continues with exactly the batches the uninterrupted run had.

The ranks' global RNGs are seeded apart, so each draws its own base seed, and every sample
carries its worker's seed: a rank resumed with another rank's state would show it. The
recipe in docs/distributed.md saves each rank's state under its own key; the same loader
saved under one key (``{"loader": loader}``: DCP keeps one rank's copy) must be refused on the
other (NOTE [ A state must fit its loader ]). Each rank writes ``OUT/rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.utils.data import Dataset

import stoker

N, BATCH, SAVE_AFTER = 22, 3, 2


class Draws(Dataset):
    """Sample ``i`` is ``[i, the seed of the worker that fetched it]``."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, torch.initial_seed() % 2**31])


def loader() -> stoker.DataLoader:
    # generator=None: the order's seed is 0 on every rank; the base seed comes from this
    # rank's global RNG.
    return stoker.DataLoader(Draws(), batch_size=BATCH, shuffle=True, shard=True, num_workers=1,
                             timeout=30)


def epoch(batches: Any) -> list[list[list[int]]]:
    return [b.tolist() for b in batches]


def main(out: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    torch.manual_seed(100 + rank)
    reference = epoch(loader())
    torch.manual_seed(100 + rank)
    saving = loader()
    it = iter(saving)
    before = [next(it).tolist() for _ in range(SAVE_AFTER)]
    # The docs' recipe (docs/distributed.md): each rank's state under its own key.
    dcp.save({f"loader_rank{rank}": saving}, checkpoint_id=f"{out}/per_rank")
    dcp.save({"loader": saving}, checkpoint_id=f"{out}/one_key")
    del it
    torch.manual_seed(0)  # the fresh loaders' own draws would differ; the state decides
    fresh = loader()
    dcp.load({f"loader_rank{rank}": fresh}, checkpoint_id=f"{out}/per_rank")
    after = epoch(fresh)
    one_key: dict[str, Any] = {}
    shared = loader()
    try:
        with warnings.catch_warnings(record=True) as told:
            warnings.simplefilter("always")
            dcp.load({"loader": shared}, checkpoint_id=f"{out}/one_key")
        one_key["warned"] = [str(w.message) for w in told if "load_state_dict" in str(w.message)]
        one_key["after"] = epoch(shared)
    except ValueError as exc:
        one_key["refused"] = str(exc)
    record = {"rank": rank, "reference": reference, "before": before, "after": after,
              "one_key": one_key}
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(record, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
