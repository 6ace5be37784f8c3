"""Make ``torch.utils.data.get_worker_info()`` answer inside stoker's workers.

User datasets shard themselves with torch's function, so stoker sets torch's own per-process
record rather than a parallel one.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data._utils import worker as _torch_worker


def set_worker_info(worker_id: int, num_workers: int, seed: int, dataset: Any) -> None:
    _torch_worker._worker_info = _torch_worker.WorkerInfo(
        id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset
    )


def get_worker_info() -> Any:
    """The current worker's ``torch.utils.data.WorkerInfo``; ``None`` in the main process."""
    return _torch_worker._worker_info
