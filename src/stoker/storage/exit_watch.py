"""Downloads in flight give up when their process exits.

NOTE [ A download gives up at exit ]
A Python process exits after joining its thread pools (``threading._shutdown`` runs the pools'
exit hooks, which wait for the work in hand): a worker stopped mid-epoch waited for each shard
download its threads had in flight, 1.32-1.36 s for a 64 MB shard at its share of a 100 MB/s
link (``benchmarks/remote_first_batch.py``, a stream over a bare shard list); a main process
exits the same way, after its download threads. A hook registered
after concurrent.futures' own, so run before it, marks the process as exiting
(``stoker._core.process_exit``); a download
checks the mark at each chunk it writes (the ``callback`` fsspec's ``get_file`` takes, and
stoker's obstore client honours) and raises ``DownloadAborted``: not retried, and cleaned up as
any failed download is (its partial file removed, its lock released). Nothing else changes:
a process that is not exiting downloads as before.
"""

from __future__ import annotations

import functools
from typing import Any

from stoker._core.process_exit import main_thread_ended


class DownloadAborted(Exception):
    """A download stopped because its process is exiting (NOTE [ A download gives up at exit ])."""


def check() -> None:
    """Raise ``DownloadAborted`` once the process has begun to exit."""
    if main_thread_ended():
        raise DownloadAborted("the process is exiting: its downloads in flight stop")


def exit_callback() -> Any:
    """An fsspec ``Callback`` for ``get_file`` that checks the mark at each chunk."""
    return _callback_class()()


@functools.cache
def _callback_class() -> type:
    """The callback's class, made once: fsspec is imported only by a source that uses it."""
    from fsspec.callbacks import Callback

    class _Check(Callback):  # type: ignore[misc]
        def call(self, *args: Any, **kwargs: Any) -> None:
            check()

    return _Check
