"""No test waits for another process or thread by sleeping (DESIGN 4, issue 47).

A sleep that waits for something (a worker to start, a file to appear, a thread to end)
is a guess at how long that takes: on a busy machine the guess is wrong and the test fails,
or it is long and the suite is slow. Tests wait on events, pipes, ``join``/``wait`` with a
timeout, or (for a condition nothing signals) ``_polling.poll_until`` with a deadline.

This test reads every ``.py`` file under ``tests/`` for ``time.sleep(``, a bare ``sleep(``,
``asyncio.sleep(`` and ``Event().wait(`` (a fresh event nobody sets: a sleep by another name).
Each remaining one is in ``ALLOWED``, keyed by its file and its line's text, with why it is
not a wait: most are what a simulated dataset, server or training step does (its behaviour,
which the test observes, not the test's timing). A new sleep fails here: wait on what it
waits for, or add it with its reason.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
_SLEEP = re.compile(r"\btime\.sleep\(|(?<![\w.])sleep\(|\basyncio\.sleep\(|Event\(\)\.wait\(")

_SIMULATED = "a simulated dataset's latency (I/O, a download): the behaviour under test"
ALLOWED: dict[tuple[str, str], str] = {
    ("_polling.py", "time.sleep(min(interval_s, left))  # no event to wait on: see the module doc"):
        "poll_until's interval: a condition with a deadline, for what nothing signals",
    ("integration/conftest.py", "time.sleep(POLL_INTERVAL_S)"):
        "the leak check's poll of /proc (processes, fds, /dev/shm): nothing signals their "
        "release; the condition (back to the baseline) decides, with a deadline",
    ("soak/test_soak.py", "time.sleep(POLL_S)"):
        "the soak's settle poll of /proc counts, as the leak check's: a condition with a "
        "deadline",
    ("contract/test_resume_contract.py",
     "time.sleep(0.005)  # only perturbs the arrival order; nothing depends on timing"):
        "makes worker 0 slower so batches overtake: the outcome must not depend on it",
    ("integration/_doctor_script.py", "time.sleep(0.010)"): _SIMULATED,
    ("integration/_doctor_script.py", "time.sleep(0.005)"):
        "the script's training step (the doctor measures the loop around it)",
    ("integration/_doctor_targets.py", "time.sleep(0.010)"): _SIMULATED,
    ("integration/test_verdict_under_load.py", "time.sleep(0.05)"):
        "a remote read off the CPU: the verdict under test must call it I/O-bound",
    ("integration/test_cli_errors.py", "time.sleep(0.001)"):
        "the user's training step in a script that runs until the test stops it",
    ("integration/_s3_server.py", "time.sleep(wait)  # the link's pace (what the cap simulates)"):
        "the simulated link's bandwidth cap",
    ("integration/_s3_server.py",
     "time.sleep(faults.latency_s)  # the server's own latency (what the test simulates)"):
        "the simulated server's latency",
    ("integration/test_obstore_by_default.py", "time.sleep(0.05)"):
        "in a script's own epilogue: polls psutil until the loader has reaped its workers "
        "(with a 30 s deadline; waiting on them itself would reap them and hide a zombie)",
    ("integration/_user_datasets.py", "threading.Event().wait(seconds)"): _SIMULATED,
    ("integration/_pack_datasets.py",
     "threading.Event().wait(120)  # the test kills the process long before"):
        "a pack worker stuck in __getitem__: the test kills it as the OOM killer would",
    ("integration/test_shutdown.py",
     "threading.Event().wait(0.05)  # keep the workers busy while the parent is stopped"):
        "a slow dataset keeping workers busy: the behaviour under test",
    ("integration/test_remote_reads_at_exit.py", "threading.Event().wait(0.01)"):
        "a prefetch thread that runs until the interpreter's shutdown flag (no event exists "
        "for it): the scenario under test, a read still going at exit",
}


def _found() -> Counter[tuple[str, str]]:
    found: Counter[tuple[str, str]] = Counter()
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(__file__).resolve():
            continue
        rel = path.relative_to(TESTS).as_posix()
        for line in path.read_text(encoding="utf-8").splitlines():
            code = line.strip()
            if code.startswith("#") or not _SLEEP.search(code):
                continue
            found[(rel, code)] += 1
    return found


def test_no_test_waits_by_sleeping() -> None:
    found = _found()
    new = {f"tests/{rel}: {code}" for rel, code in found if (rel, code) not in ALLOWED}
    assert not new, (
        "a sleep in tests/ that is not in tests/unit/test_no_sleeps.py's ALLOWED: wait on what "
        "it waits for (an event, a pipe, join/wait with a timeout, or _polling.poll_until for "
        "a condition nothing signals); if it is not a wait (a simulated latency), add it to "
        "ALLOWED with why:\n  " + "\n  ".join(sorted(new)))


def test_every_allowed_sleep_still_exists() -> None:
    found = _found()
    stale = [f"tests/{rel}: {code}" for rel, code in ALLOWED if (rel, code) not in found]
    assert not stale, f"ALLOWED names sleeps that are gone; delete them: {stale}"
