"""Whether this process has begun to exit, at two moments.

* ``main_thread_ended()``: a hook registered with ``threading._register_atexit`` runs when the
  main thread ends, before the interpreter joins the other non-daemon threads (NOTE [ A
  download gives up at exit ] in ``storage.exit_watch``). concurrent.futures registers its own
  such hook, which waits for the work its pools hold; ours is registered after it, so it runs
  first.
* ``at_exit()``: the main thread has ended and so has every other non-daemon thread, which is
  where the interpreter runs its ``atexit`` hooks, weakref's finalizers marked for exit among
  them (NOTE [ Workers at interpreter exit ] in ``workers.launch``). A training loop still
  running in a non-daemon thread after the main thread ended is not at exit yet. Read from
  the threads, not set by an ``atexit`` hook of stoker's: a program that counts its process's
  exit hooks (``atexit._ncallbacks()``) sees torch's number.
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  (its exit hook first: ours must run before it)
import threading

_MAIN_THREAD_ENDED = threading.Event()


def main_thread_ended() -> bool:
    """True once the main thread has ended (the process is on its way out)."""
    return _MAIN_THREAD_ENDED.is_set()


def at_exit() -> bool:
    """True once the interpreter runs its ``atexit`` hooks (the non-daemon threads are done)."""
    main = threading.main_thread()
    if main.is_alive():
        return False
    return not any(t.is_alive() and not t.daemon
                   for t in threading.enumerate() if t is not main)


try:
    threading._register_atexit(_MAIN_THREAD_ENDED.set)  # type: ignore[attr-defined]
except RuntimeError:  # first imported while the process exits: it is exiting
    _MAIN_THREAD_ENDED.set()
