"""What a dataset sees of the process it runs in, and what the main process is left with,
under one loader in a fresh interpreter (issue 44). Run as::

    STOKER_PROBE_LOADER=torch|stoker python _process_probe.py default|fork|spawn

and it prints one JSON object. A fresh interpreter per run, so that process numbers
(``Process-N``) and torch's once-per-process SIGCHLD handler start from the same place for
both loaders. ``tests/integration/test_worker_process_as_torch.py`` compares the two outputs.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import gc
import json
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
import threading
import warnings

import torch
import torch.utils.data

WATCHED = ("SIGINT", "SIGTERM", "SIGCHLD", "SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGHUP")


def handler_name(handler: object) -> str:
    if handler in (signal.SIG_DFL, signal.SIG_IGN):
        return str(signal.Handlers(handler).name)
    if handler is None:
        return "None"
    return f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', '?')}"


def masks(status: str) -> dict[str, list[int]]:
    """The signal masks of a /proc/<pid>/status text, as sorted signal numbers."""
    out = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("SigIgn", "SigBlk", "SigCgt"):
            bits = int(value.strip(), 16)
            out[key] = [n for n in range(1, 65) if bits >> (n - 1) & 1]
    return out


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class Cycle:
    """Cyclic garbage the main process leaves behind before iter(): its finalizer counts."""

    finalized: list[int] = []

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        Cycle.finalized.append(os.getpid())


class Probe(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.parent_environ = dict(os.environ)

    def __len__(self) -> int:
        return 4  # each worker's second sample comes after its first put (its feeder thread)

    def __getitem__(self, i: int) -> str:
        info = torch.utils.data.get_worker_info()
        child = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True,
                               timeout=60, check=True).stdout
        own_status = read("/proc/self/status")
        collected = gc.collect()
        seen = {
            "signals": {s: handler_name(signal.getsignal(getattr(signal, s))) for s in WATCHED},
            "masks": {k: v for k, v in masks(own_status).items() if k != "SigCgt"},
            # caught at the C level (torch's handlers, faulthandler's), real-time ones too
            "caught": masks(own_status)["SigCgt"],
            "child_masks": masks(child),
            "process_name": multiprocessing.current_process().name,
            "comm": read("/proc/self/comm").strip(),
            "thread_comm": read("/proc/thread-self/comm").strip(),
            "thread_name": threading.current_thread().name,
            "new_thread_name": threading.Thread(target=print).name,
            "threads": sorted(t.name for t in threading.enumerate()),
            "info_type": f"{type(info).__module__}.{type(info).__qualname__}",
            "info_fields": [f.name for f in dataclasses.fields(info)],
            "info_repr": repr(info).replace(repr(info.dataset), "<dataset>"),
            "gc_frozen": gc.get_freeze_count(),
            "gc_enabled": gc.isenabled(),
            "gc_collected_cycles": collected > 0,
            "cycles_finalized_here": Cycle.finalized.count(os.getpid()),
            "torch_threads": torch.get_num_threads(),
            "argv": sys.argv,
            "environ_changed": sorted(k for k in set(os.environ) | set(self.parent_environ)
                                      if os.environ.get(k) != self.parent_environ.get(k)),
            "rlimits": [resource.getrlimit(getattr(resource, name))
                        for name in ("RLIMIT_NOFILE", "RLIMIT_CORE", "RLIMIT_NPROC")],
            "cwd": os.getcwd(),
            "umask": _umask(),
            "stdin": os.readlink(f"/proc/self/fd/{sys.stdin.fileno()}"),
            "faulthandler": faulthandler.is_enabled(),
            "warning_filters": len(warnings.filters),
        }
        return json.dumps(seen, sort_keys=True)


def main(method: str) -> None:
    if os.environ["STOKER_PROBE_LOADER"] == "stoker":
        import stoker

        loader_cls = stoker.DataLoader
    else:
        loader_cls = torch.utils.data.DataLoader
    torch.manual_seed(0)
    gc.disable()  # the cycles stay uncollected in the main process until the workers start
    garbage = [Cycle() for _ in range(5)]
    del garbage
    context = None if method == "default" else method
    loader = loader_cls(Probe(), batch_size=None, num_workers=2, multiprocessing_context=context,
                        timeout=120)
    seen, main_threads = [], []
    for sample in loader:
        seen.append(json.loads(sample))
        # torch's index queues' feeder threads, one per worker once it has been put to
        main_threads.append(sorted(t.name for t in threading.enumerate()))
    gc.enable()
    print(json.dumps({
        "workers": seen,
        "main_sigchld": handler_name(signal.getsignal(signal.SIGCHLD)),
        "main_sigint": handler_name(signal.getsignal(signal.SIGINT)),
        "main_process_counter_next": next(multiprocessing.process._process_counter),
        "main_gc_frozen": gc.get_freeze_count(),
        "main_threads": main_threads,
    }, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1])
