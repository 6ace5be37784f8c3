"""A remote read in a process that is exiting: a worker ends while its prefetch threads still
download, and a read that cannot start (the pools take no new work) is not retried through
the backoff (``stoker.storage.retry._exiting``)."""

from __future__ import annotations

import subprocess
import sys

_READ_WHILE_EXITING = """
import concurrent.futures, concurrent.futures.thread as futures_thread, threading
from stoker.storage import RetryPolicy
from stoker.storage.retry import ReadRequest, read_with_retries
attempts = []

def read():  # a request starting its name lookup on a pool, as aiohttp's does
    attempts.append(1)
    return concurrent.futures.ThreadPoolExecutor(1).submit(bytes, 1).result()

def prefetch():  # a prefetch thread still reading when the program ends
    while not futures_thread._shutdown:
        threading.Event().wait(0.01)
    try:
        read_with_retries(ReadRequest("s3://b/k"), read, RetryPolicy(attempts=4), None,
                          sleep=lambda s: None)
    except OSError as exc:
        print(len(attempts), type(exc.__cause__).__name__, flush=True)

threading.Thread(target=prefetch).start()
"""


def test_a_read_in_a_process_that_exits_is_not_retried() -> None:
    """A worker exiting while its prefetch threads download: its pools take no new work, so a
    request cannot start, and retrying it only kept the worker alive through the backoff
    (~5 s under the default policy). Its read fails at once."""
    done = subprocess.run([sys.executable, "-c", _READ_WHILE_EXITING], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "RuntimeError"]
