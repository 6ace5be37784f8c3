"""Whether this process has begun to exit.

A hook registered with ``threading._register_atexit`` runs when the main thread ends, before any
``atexit`` handler (weakref finalizers', multiprocessing's): so code that runs at exit can tell
it is running there (NOTE [ Workers at interpreter exit ] in ``workers.launch``, NOTE [ A
download gives up at exit ] in ``storage.exit_watch``). concurrent.futures registers its own
such hook, which waits for the work its pools hold; ours is registered after it, so it runs
first.
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  (its exit hook first: ours must run before it)
import threading

EXITING = threading.Event()


def exiting() -> bool:
    """True once the process has begun to exit (its main thread has ended)."""
    return EXITING.is_set()


try:
    threading._register_atexit(EXITING.set)  # type: ignore[attr-defined]
except RuntimeError:  # first imported while the process exits: it is exiting
    EXITING.set()
