"""CUDA and worker processes: torch's start method by default, ``forkserver`` when asked.

A forked child cannot use a CUDA context its parent created ("CUDA error: initialization
error"). torch forks anyway, and so does stoker by default: a dataset that never touches CUDA
in its workers (most of them: the model is on the GPU, the samples are not) runs as under
torch, and one that does fails in the worker with a note that says what to change
(``workers.remote_errors.CUDA_HINT``, naming the dataset's CUDA tensors). Asked for
(``cuda_forkserver``, NOTE [ Same as torch unless asked ]), workers that would be forked once
CUDA is initialised start with ``forkserver`` instead, where they may use CUDA, after checking
that the dataset pickles (it must, there), with a precise error if not.
"""

from __future__ import annotations

import io
import logging
import multiprocessing
from multiprocessing.context import BaseContext
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from stoker.errors import CudaInWorkersError

log = logging.getLogger(__name__)


def _pickle_error(objects: dict[str, Any]) -> str | None:
    for name, obj in objects.items():
        try:
            ForkingPickler(io.BytesIO(), 2).dump(obj)
        except Exception as exc:
            return f"{name} does not pickle ({type(exc).__name__}: {exc})"
    return None


def safe_context(requested: BaseContext | None, default: BaseContext, plan: Any) -> BaseContext:
    """The start method to use: the default, unless ``cuda_forkserver`` is asked for and it
    would fork a process that holds CUDA. ``plan``: the pass's ``Plan`` (its dataset,
    collate_fn and worker_init_fn are pickled)."""
    if requested is not None or default.get_start_method() != "fork":
        return requested or default
    if "cuda_forkserver" not in plan.fetch.beyond or not torch.cuda.is_initialized():
        return default
    problem = _pickle_error(
        {"the dataset": plan.dataset, "collate_fn": plan.collate_fn,
         "worker_init_fn": plan.worker_init_fn}
    )
    if problem is not None:
        raise CudaInWorkersError(
            "CUDA is already initialised in this process and beyond_torch asks for "
            "'cuda_forkserver', so stoker starts workers with 'forkserver', which pickles what "
            f"they need; but {problem}. Define the dataset class and functions at module level "
            "(no lambdas, open files or locks), or leave 'cuda_forkserver' off to fork the "
            "workers as torch does (they must then not use CUDA), or use num_workers=0."
        )
    log.info(
        "stoker: CUDA is already initialised in this process and forked workers cannot use it; "
        "starting them with 'forkserver' instead, as asked (beyond_torch 'cuda_forkserver'); "
        "the dataset is pickled to each worker."
    )
    return multiprocessing.get_context("forkserver")
