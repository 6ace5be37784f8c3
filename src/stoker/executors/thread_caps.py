"""Cap native thread pools inside a worker process.

A forked worker inherits the parent's memory but none of its threads: a thread pool the parent
already started (OpenCV's, GNU OpenMP's) looks alive to the library in the child and can
deadlock the first parallel call there. Even when it does not, N workers × all cores threads
oversubscribe the machine. Like torch (which only sets its own intra-op threads to 1), stoker
sets one thread per pool, but for every pool it can reach: torch, OpenCV, and the OpenMP /
BLAS runtimes already loaded (through threadpoolctl when installed); the ``*_NUM_THREADS``
variables cover libraries the worker loads later. Only the worker is changed; the parent's
settings are untouched.

OpenCV cannot be fixed from inside the child: ``cv2.setNumThreads`` there destroys the
inherited pool's condition variables, whose waiters do not exist in the child, and hangs (seen
here in about one fork in seven). So ``pools_quiet_for_fork`` shrinks OpenCV's pool in the
parent, where its threads exist, for the moment of the fork, and restores it right after.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import torch

_THREAD_ENV = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS",
)


def cap_worker_threads(threads: int = 1) -> list[str]:
    """Limit every reachable native pool to ``threads``; returns what was capped."""
    capped = []
    for name in _THREAD_ENV:
        os.environ[name] = str(threads)
    torch.set_num_threads(threads)
    capped.append("torch")
    cv2 = sys.modules.get("cv2")
    if cv2 is not None:  # only if the user's code imported it; never import it ourselves
        try:
            cv2.setNumThreads(threads)
            cv2.ocl.setUseOpenCL(False)
            capped.append("cv2")
        except Exception:  # an unusual build without these entry points
            pass
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return capped
    try:
        threadpool_limits(limits=threads)
        capped.append("threadpoolctl")
    except Exception:
        pass
    return capped


@contextlib.contextmanager
def pools_quiet_for_fork(start_method: str | None) -> Iterator[None]:
    """Around forking workers: no OpenCV pool threads exist while the children are made."""
    cv2 = sys.modules.get("cv2") if start_method == "fork" else None
    saved = None
    if cv2 is not None:
        try:
            saved = cv2.getNumThreads()
            cv2.setNumThreads(1)
        except Exception:
            saved = None
    try:
        yield
    finally:
        if saved is not None and cv2 is not None:
            cv2.setNumThreads(saved)
