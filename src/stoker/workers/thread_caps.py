"""Cap native thread pools inside a worker process.

A forked worker inherits the parent's memory but none of its threads: a thread pool the parent
already started (OpenCV's, GNU OpenMP's) looks alive to the library in the child and can
deadlock the first parallel call there. Even when it does not, N workers × all cores threads
oversubscribe the machine. By default a worker sets only torch's intra-op threads to 1, as
torch's does; asked for (``thread_caps``), stoker sets one thread per pool, for every pool it
can reach: torch, OpenCV, and the OpenMP / BLAS runtimes already loaded; the ``*_NUM_THREADS``
variables cover libraries the worker loads later. Only the worker is changed; the parent's
settings are untouched. Pools are found in /proc/self/maps and capped through each library's own
setter, which is what threadpoolctl does, at a hundredth of its cost.

OpenCV cannot be fixed from inside the child: ``cv2.setNumThreads`` there destroys the
inherited pool's condition variables, whose waiters do not exist in the child, and hangs (seen
here in about one fork in seven). So ``pools_quiet_for_fork`` shrinks OpenCV's pool in the
parent, where its threads exist, for the moment of the fork, and restores it right after (in
the parent, and in the worker, which then reads the count torch's worker would read: safety,
with nothing a program can tell).

NOTE [ OpenBLAS after fork ]
OpenBLAS shuts its pool down before every fork (an atfork handler) and rebuilds it lazily. Its
setter rebuilds it first, and the new threads spin waiting for work for ~0.1 s: about 60 ms of
CPU per call on this machine, whether called in a forked worker (per worker start) or in the
parent right after forking (where it competed with the workers' first batches). So a forked
worker writes the count the setter would leave, the library's ``blas_cpu_number``, directly:
one thread, no pool built (a single-threaded call never needs one), and the parent's OpenBLAS
is not touched at all, as with torch. A build that does not export it gets its setter.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

_THREAD_ENV = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS",
)


# Entry points that set a native pool's size, by the library that exports them.
_SETTERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("openblas", (
        "openblas_set_num_threads", "openblas_set_num_threads64_",
        "scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
    )),
    ("mkl_rt", ("MKL_Set_Num_Threads",)),
    ("blis", ("bli_thread_set_num_threads",)),
    ("gomp", ("omp_set_num_threads",)),
    ("iomp5", ("omp_set_num_threads",)),
    ("libomp", ("omp_set_num_threads",)),
)


def _loaded_pool_libraries() -> list[tuple[str, tuple[str, ...]]]:
    """(path, setter names) of every thread-pool library mapped into this process (Linux)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            paths = {parts[5].strip() for parts in map(str.split, f) if len(parts) == 6}
    except OSError:
        return []
    found = []
    for path in paths:
        name = os.path.basename(path)
        for key, setters in _SETTERS:
            if key in name and ".so" in name:
                found.append((path, setters))
    return found


class Pool(NamedTuple):
    """One loaded thread-pool library: its setter, and for OpenBLAS the count it keeps."""

    name: str
    setter: Any
    blas_count: Any = None  # ctypes.c_int over OpenBLAS's blas_cpu_number, if exported


def _find_pools() -> list[Pool]:
    found = []
    for path, setters in _loaded_pool_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for setter in setters:
            fn = getattr(lib, setter, None)
            if fn is not None:
                name = os.path.basename(path)
                count = None
                if "openblas" in name:
                    with contextlib.suppress(ValueError):
                        count = ctypes.c_int.in_dll(lib, "blas_cpu_number")
                found.append(Pool(name, fn, count))
                break
    return found


# (len(sys.modules) when found, pools). Found in the main process before it forks workers,
# so a forked worker inherits them and skips reading /proc/self/maps (2-15 ms per worker
# start measured here). A native library comes with an import, so a new import re-scans.
_found: tuple[int, list[Pool]] | None = None


def pool_setters() -> list[Pool]:
    """The loaded pool libraries, found again only after new imports."""
    global _found
    if _found is None or _found[0] != len(sys.modules):
        _found = (len(sys.modules), _find_pools())
    return _found[1]


def _cap_native_pools(threads: int, forked: bool) -> list[str]:
    """Call each loaded library's own setter (what threadpoolctl does, without its scan cost);
    in a forked worker, OpenBLAS's count is written instead (NOTE [ OpenBLAS after fork ])."""
    capped = []
    for pool in pool_setters():
        if forked and pool.blas_count is not None:
            pool.blas_count.value = threads
        else:
            pool.setter(threads)
        capped.append(pool.name)
    return capped


def cap_worker_threads(
    threads: int = 1, forked: bool = False, every_pool: bool = True
) -> list[str]:
    """Limit torch's pool to ``threads``, as torch's workers do; with ``every_pool`` (beyond
    torch: ``thread_caps``, NOTE [ Same as torch unless asked ]) also OpenCV's (OpenCL off),
    the BLAS/OpenMP runtimes and the ``*_NUM_THREADS`` variables, all of which a program can
    read. Without it, a worker forked inside ``pools_quiet_for_fork`` gets back the OpenCV
    thread count the parent had, in a fresh pool: what torch's worker reads, without the
    inherited pool that can deadlock it. Returns what was capped."""
    if every_pool:
        for name in _THREAD_ENV:
            os.environ[name] = str(threads)
    torch.set_num_threads(threads)
    capped = ["torch"]
    cv2 = sys.modules.get("cv2")
    if cv2 is not None:  # only if the user's code imported it; never import it ourselves
        try:
            if every_pool:
                cv2.setNumThreads(threads)
                cv2.ocl.setUseOpenCL(False)
                capped.append("cv2")
            elif forked and _cv2_threads_at_fork is not None:
                cv2.setNumThreads(_cv2_threads_at_fork)
        except Exception:  # an unusual build without these entry points
            pass
    return capped + (_cap_native_pools(threads, forked) if every_pool else [])


# OpenCV's thread count in the parent while workers are forked with its pool quiet: a forked
# worker restores it (``cap_worker_threads``).
_cv2_threads_at_fork: int | None = None


@contextlib.contextmanager
def pools_quiet_for_fork(start_method: str | None) -> Iterator[None]:
    """Around forking workers: no OpenCV pool threads exist while the children are made."""
    global _cv2_threads_at_fork
    if start_method == "fork":
        pool_setters()  # found here once, inherited by every worker
    cv2 = sys.modules.get("cv2") if start_method == "fork" else None
    saved = None
    if cv2 is not None:
        try:
            saved = cv2.getNumThreads()
            cv2.setNumThreads(1)
        except Exception:
            saved = None
    _cv2_threads_at_fork = saved
    try:
        yield
    finally:
        _cv2_threads_at_fork = None
        if saved is not None and cv2 is not None:
            cv2.setNumThreads(saved)
