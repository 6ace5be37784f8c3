"""Make ``torch.utils.data.get_worker_info()`` answer inside stoker's workers.

User datasets shard themselves with torch's function, so stoker sets torch's own per-process
record, of torch's own type: a program sees the same ``WorkerInfo`` (its type, fields, repr,
``dataclasses.asdict``) as in torch's workers. What stoker knows beyond it (the rank, and a
reader's place among ranks × workers) is ``stoker.distributed.shard_info()``.

torch 2.13's ``WorkerInfo`` is a frozen dataclass; before it, a plain class taking keyword
arguments and read-only once built: both are built with the same keywords, so stoker runs on
the torch a GPU machine ships as on the pinned 2.13.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data._utils import worker as _torch_worker


def set_worker_info(worker_id: int, num_workers: int, seed: int, dataset: Any) -> None:
    """Set torch's record as torch's ``_worker_loop`` does."""
    _torch_worker._worker_info = _torch_worker.WorkerInfo(
        id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset
    )


def get_worker_info() -> Any:
    """The current worker's ``torch.utils.data.WorkerInfo``; ``None`` in the main process."""
    return _torch_worker._worker_info
