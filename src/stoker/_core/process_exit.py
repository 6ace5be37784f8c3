"""Whether this process has begun to exit, at two moments.

* ``main_thread_ended()``: a hook registered with ``threading._register_atexit`` runs when the
  main thread ends, before the interpreter joins the other non-daemon threads (NOTE [ A
  download gives up at exit ] in ``storage.exit_watch``). concurrent.futures registers its own
  such hook, which waits for the work its pools hold; ours is registered after it, so it runs
  first.
* ``at_exit()``: an ``atexit`` hook, which runs once those threads are done, before the
  ``atexit`` hook that runs weakref finalizers marked for exit (NOTE [ Workers at interpreter
  exit ] in ``workers.launch``). A training loop still running in a non-daemon thread after the
  main thread ended is not at exit yet.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401  (its exit hook first: ours must run before it)
import threading
import weakref

_MAIN_THREAD_ENDED = threading.Event()
_AT_EXIT = threading.Event()


def main_thread_ended() -> bool:
    """True once the main thread has ended (the process is on its way out)."""
    return _MAIN_THREAD_ENDED.is_set()


def at_exit() -> bool:
    """True once the interpreter runs its ``atexit`` hooks (the non-daemon threads are done)."""
    return _AT_EXIT.is_set()


try:
    threading._register_atexit(_MAIN_THREAD_ENDED.set)  # type: ignore[attr-defined]
except RuntimeError:  # first imported while the process exits: it is exiting
    _MAIN_THREAD_ENDED.set()
# weakref's exit hook is registered with the first finalize ever made (torch's import makes
# one); made here if not yet, so that ours, registered after it, runs before it.
weakref.finalize(_AT_EXIT, lambda: None).atexit = False
atexit.register(_AT_EXIT.set)
