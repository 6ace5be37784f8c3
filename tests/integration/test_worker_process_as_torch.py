"""Issue 44: the process a dataset runs in is torch's. Each test runs the same program under
torch's DataLoader and under stoker's, each in a fresh interpreter (process numbers and
torch's once-per-process SIGCHLD handler start from the same place), and compares what the
program sees; each failed on 0cf7488 (SIGINT ignored in workers and in every program they
start, ``stoker-worker-N`` process names, no ``pt_data_worker`` thread name, a ``WorkerInfo``
subclass, the parent's objects frozen in the workers, a ``Thread-N`` number taken, no SIGCHLD
handler in the main process).

NOTE [ The worker's process is torch's ] in ``stoker/workers/entry.py`` is the design.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _probe_run import HERE, RUN_S, probe_env, run_probe

from _polling import poll_until


def _probe(loader: str, method: str, **extra_env: str) -> dict:
    out = run_probe(loader, "_process_probe.py", method, **extra_env).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.parametrize("method", ["default", "fork", "spawn"])
def test_a_dataset_sees_torchs_worker_process(method, stoker_only):
    torchs, stokers = _probe("torch", method), _probe("stoker", method)
    # faulthandler as a fresh interpreter has it, off, and the same signals caught, real-time
    # ones too: NOTE [ faulthandler as the parent left it ], NOTE [ Stacks on request ]
    assert torchs["workers"][0]["faulthandler"] is False
    assert stokers == torchs
    worker = torchs["workers"][0]
    # what the comparison covers, as torch gives it
    assert worker["signals"]["SIGINT"] == "_signal.default_int_handler"
    assert int(signal.SIGINT) not in worker["child_masks"]["SigIgn"]
    assert worker["comm"] == worker["thread_comm"] == "pt_data_worker"
    assert worker["info_type"] == "torch.utils.data._utils.worker.WorkerInfo"
    assert torchs["main_sigchld"].startswith("torch.utils.data._utils.signal_handling.")
    # multiprocessing_context=None: the generic Process class, named Process-N (the fuzzer
    # found ForkProcess-N: stoker's default was the fork context)
    assert worker["process_name"] == {"default": "Process-1", "fork": "ForkProcess-1",
                                      "spawn": "SpawnProcess-1"}[method]


@pytest.mark.parametrize("method", ["default", "spawn"])
def test_faulthandler_the_parent_turned_on_is_on_in_the_worker(method, stoker_only):
    # PYTHONFAULTHANDLER=1: on in the main process, inherited by a forked worker and set
    # again by a spawned one's interpreter; stoker's worker only changes where it writes.
    torchs = _probe("torch", method, PYTHONFAULTHANDLER="1")
    stokers = _probe("stoker", method, PYTHONFAULTHANDLER="1")
    assert torchs["workers"][0]["faulthandler"] is True
    assert stokers == torchs


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    """Until ``path`` exists; fails at once if ``proc`` ended first."""
    if not poll_until(lambda: path.exists() or proc.poll() is not None, RUN_S):
        pytest.fail(f"no {path.name} after {RUN_S} s")
    if not path.exists():
        pytest.fail(f"the script ended before {path.name}: exit code {proc.returncode}")


def _ctrl_c(loader: str, out: Path) -> dict:
    """Run the script in its own process group, Ctrl-C it once the tool runs, and say whether
    the tool got the SIGINT (saved its output) and whether it is still running."""
    out.mkdir()
    env = probe_env(loader)
    # Files, not pipes: a tool that outlives the script would hold a pipe open.
    with open(out / "stdout", "w") as stdout, open(out / "stderr", "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(HERE / "_ctrl_c_script.py"), str(out)],
                                env=env, cwd=HERE, start_new_session=True, stdout=stdout,
                                stderr=stderr)
    tool_pid = None
    try:
        _wait_for(out / "started", proc)
        tool_pid = int((out / "started").read_text())
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        proc.wait(timeout=RUN_S)
        said = (out / "stdout").read_text().strip().splitlines()[-1:]
        return {"saved": (out / "saved").exists(), "main": said,
                "tool_running": _running(tool_pid)}
    finally:
        for pid in [proc.pid] + ([tool_pid] if tool_pid else []):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=RUN_S)
        if tool_pid is not None:
            _reap(tool_pid)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (the tool is the script's grandchild: not ours to wait for)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _reap(pid: int) -> None:
    poll_until(lambda: not _running(pid), RUN_S)  # not our child: nothing to wait() on


def test_a_tool_a_worker_runs_stops_on_ctrl_c_as_under_torch(tmp_path, stoker_only):
    torchs = _ctrl_c("torch", tmp_path / "torch")
    stokers = _ctrl_c("stoker", tmp_path / "stoker")
    assert torchs == {"saved": True, "main": ["KeyboardInterrupt"], "tool_running": False}
    assert stokers == torchs


@pytest.mark.parametrize("shape", ["short_sampler", "persistent", "iterable", "batched",
                                   "tensors"])
def test_the_threads_a_program_and_a_dataset_see_are_torchs(shape, stoker_only):
    # torch's queues' feeder threads: one per worker put to, in the main process, and one in
    # a worker once it has put (NOTE [ torch's feeder thread in a worker ]); failed before
    # stoker started stand-ins (no QueueFeederThread anywhere)
    def seen(loader: str) -> list:
        return json.loads(run_probe(loader, "_threads_probe.py", shape).stdout.splitlines()[-1])

    torchs = seen("torch")
    assert seen("stoker") == torchs
    assert any("QueueFeederThread" in s["in_loop"] for s in torchs)
