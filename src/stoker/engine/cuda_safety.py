"""CUDA and worker processes: refuse or reroute before a worker ever sees CUDA.

A forked child cannot use a CUDA context its parent created ("CUDA error: initialization
error"), and a dataset holding CUDA tensors drags CUDA into every worker. So, before workers
start: a dataset with accelerator tensors is refused with the fix; and when CUDA is already
initialised and workers would be forked by default, they are started with ``forkserver``
instead, after checking that the dataset pickles (it must, there), with a precise error if not;
that switch is said on the ``stoker.engine.cuda_safety`` logger, not through ``warnings``: the
run goes on and succeeds (NOTE [ torch's voice ] in ``_core/torch_voice.py``).
"""

from __future__ import annotations

import io
import logging
import multiprocessing
from multiprocessing.context import BaseContext
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from stoker._core.walk import iter_attributes
from stoker.errors import CudaInWorkersError

log = logging.getLogger(__name__)


def find_device_tensors(dataset: Any, device_types: frozenset[str]) -> list[tuple[str, str]]:
    """``(path, device)`` of tensors on the given device types held by the dataset."""
    found = []
    for path, value in iter_attributes(dataset):
        if isinstance(value, torch.Tensor) and value.device.type in device_types:
            found.append((path, str(value.device)))
    return found


def refuse_device_tensors(
    dataset: Any, num_workers: int, device_types: frozenset[str] = frozenset({"cuda"})
) -> None:
    found = find_device_tensors(dataset, device_types)
    if not found:
        return
    path, device = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    raise CudaInWorkersError(
        f"DataLoader(num_workers={num_workers}) cannot hand {path} to worker processes: it is "
        f"a tensor on {device}{more}, and workers cannot use CUDA (they fail with 'CUDA error: "
        f"initialization error'). Keep dataset tensors on the CPU ({path} = {path}.cpu()) and "
        "move each batch to the GPU in the training loop with batch.to(device, "
        "non_blocking=True) (pin_memory=True makes that copy asynchronous); or use "
        "num_workers=0."
    )


def _pickle_error(objects: dict[str, Any]) -> str | None:
    for name, obj in objects.items():
        try:
            ForkingPickler(io.BytesIO(), 2).dump(obj)
        except Exception as exc:
            return f"{name} does not pickle ({type(exc).__name__}: {exc})"
    return None


def safe_context(requested: BaseContext | None, default: BaseContext, plan: Any) -> BaseContext:
    """The start method to use: the default unless it would fork a process that holds CUDA.
    ``plan``: the pass's ``Plan`` (its dataset, collate_fn and worker_init_fn are pickled)."""
    if requested is not None or default.get_start_method() != "fork":
        return requested or default
    if not torch.cuda.is_initialized():
        return default
    problem = _pickle_error(
        {"the dataset": plan.dataset, "collate_fn": plan.collate_fn,
         "worker_init_fn": plan.worker_init_fn}
    )
    if problem is not None:
        raise CudaInWorkersError(
            "CUDA is already initialised in this process, so workers cannot be forked and "
            f"stoker must start them with 'forkserver', which pickles what they need; but "
            f"{problem}. Define the dataset class and functions at module level (no lambdas, "
            "open files or locks), or create and iterate the DataLoader before CUDA is first "
            "used, or use num_workers=0."
        )
    log.warning(
        "stoker: CUDA is already initialised in this process and forked workers cannot use it; "
        "starting them with 'forkserver' instead (the dataset is pickled to each worker). Pass "
        "multiprocessing_context='forkserver' (or 'spawn') to choose this explicitly."
    )
    return multiprocessing.get_context("forkserver")
