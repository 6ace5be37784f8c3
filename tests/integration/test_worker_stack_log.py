"""A worker's stack log and request pipe, installed in a fresh interpreter: the stack signal
is caught only where the doctor asked (NOTE [ The stack signal ]), and a request is answered
with the stacks of every thread but the one answering (NOTE [ Stacks on request ])."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

_WORKER_SIDE = textwrap.dedent("""
    import json, os, sys
    from stoker.workers import diagnostics
    log = diagnostics.install_in_worker(by_signal=sys.argv[1] == "signal")
    with open("/proc/self/status") as f:
        cgt = next(int(l.split()[1], 16) for l in f if l.startswith("SigCgt:"))
    os.write(log.ask_end, b"s")  # as the main process asks
    asked = os.read(log.requests, 64)  # as the parent watch reads it
    diagnostics.answer_request(log.fd)
    print(json.dumps({
        "caught": bool(cgt >> (int(diagnostics.DUMP_SIGNAL) - 1) & 1),
        "asked": asked.decode(),
        "dump": diagnostics.segments.read_log(log.fd),
    }))
""")


def _worker_side(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _WORKER_SIDE, mode], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    return json.loads(out.splitlines()[-1])


def test_a_worker_catches_the_stack_signal_only_for_the_doctor():
    assert _worker_side("plain")["caught"] is False
    assert _worker_side("signal")["caught"] is True


def test_a_request_is_answered_in_the_log():
    seen = _worker_side("plain")
    assert seen["asked"] == "s"
    assert "Current thread" in seen["dump"] and "<module>" in seen["dump"]
