"""Real process groups (gloo on 127.0.0.1, ranks started by torch.multiprocessing): rank
detection, ShardedSampler coverage under each evenness policy with a collective in every step
(a rank that stopped early would hang it), the epoch autopilot, an IterableDataset read once
across ranks × 2 workers, and an elastic resume saved at world size 3, finished at 2.

Each rank writes what it read to a JSON file; the assertions run here, in the parent, on the
union. Every blocking call has a timeout: the process group's (collectives) and the launcher's,
derived from progress, not from a guess at how long a launch takes on a busy machine: each
rank marks its progress (joined the group, each step, each part of the plan) in a file, and a
launch is hung only when no rank has marked anything for ``STALL_S``; then every rank's stack
(faulthandler, on SIGUSR1), its last mark and the launch's processes are reported, and the
ranks are killed (issue 47: a fixed 45 s launch deadline failed on a busy machine).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader, Dataset, IterableDataset

import stoker
from stoker.distributed import (
    DistContext,
    EndOfData,
    ShardedSampler,
    begin_epoch,
    detect,
    even_batches,
    shard_info,
    shard_iterable,
)

# Ranks fork from a fresh launcher process (run_ranks): a spawned rank re-imports torch, 5-12 s
# each on 2 busy cores, against milliseconds for a fork, and the launcher imports it once. Safe
# because the launcher never joins a process group (nothing distributed is inherited) and torch
# re-creates its thread pools after fork. "spawn" works too (the functions below are
# importable), only slower.
START_METHOD = "fork"
COLLECTIVE_TIMEOUT_S = 60.0  # a peer's step is milliseconds of work; a busy machine's queue
STALL_S = COLLECTIVE_TIMEOUT_S + 30  # no rank marked progress: hung (after a collective's own
                                     # timeout, whose error says more)
LAUNCH_CAP_S = 300.0  # a launch still progressing after this is broken too (quiet: ~10 s)
LAUNCHER_SLACK_S = 60.0  # the launcher's own start (imports torch on a busy machine) and report
POLL_S = 1.0  # how often a waiting launcher looks at the progress marks (joins in between)
# The runs fixture (two launches) runs in the first test's setup.
pytestmark = pytest.mark.timeout(2 * (LAUNCH_CAP_S + LAUNCHER_SLACK_S) + 60)
N, BATCH = 23, 4  # 23 is prime: no world size divides it, so every policy has a tail to handle
ELASTIC_N, ELASTIC_BATCH, ELASTIC_STEPS = 23, 2, 2


class Indices(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Stream(IterableDataset[tuple[int, int]]):
    """Shards itself with stoker's helper; records which reader produced each element."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        shard = shard_info()
        for x in shard_iterable(range(self.n), shard):
            yield (x, shard.shard_id)


# -- what each rank runs ---------------------------------------------------------------------

_progress: TextIO | None = None  # this rank's progress file (set by _rank_with_progress)


def mark(what: str) -> None:
    """Note progress (the launcher's hang detection reads it); a no-op outside a launch."""
    if _progress is not None:
        _progress.write(f"{time.monotonic():.3f} {what}\n")
        _progress.flush()


def _read_epoch(sampler: ShardedSampler, rank: int) -> tuple[list[list[int]], int]:
    """One epoch the way a DDP loop sees it; an all_reduce per step stands in for DDP's."""
    loader = DataLoader(Indices(sampler.dataset_len), batch_size=BATCH, sampler=sampler)
    batches: list[list[int]] = []
    steps = 0
    for batch in even_batches(loader, sampler.num_batches(BATCH), rank=rank):
        real = [] if isinstance(batch, EndOfData) else batch.tolist()
        step = torch.tensor([1, len(real)])
        dist.all_reduce(step)  # would time out if some rank had stopped stepping
        assert int(step[0]) == dist.get_world_size()
        mark(f"epoch {sampler.epoch} step {steps}")
        batches.append(real)
        sampler.advance(BATCH)
        steps += 1
    return batches, steps


def plan_shard(rank: int, world: int) -> dict[str, Any]:
    ctx = detect()
    out: dict[str, Any] = {"context": [ctx.rank, ctx.world_size, ctx.source]}
    for even in ("pad", "drop", "exact"):
        sampler = ShardedSampler(N, rank=ctx.rank, world_size=ctx.world_size, seed=1, even=even)
        epochs = []
        for _ in range(2):
            begin_epoch(sampler)  # the autopilot: the second pass must reshuffle
            batches, steps = _read_epoch(sampler, rank)
            all_steps: list[Any] = [None] * world
            dist.all_gather_object(all_steps, steps)
            epochs.append({"epoch": sampler.epoch, "batches": batches, "all_steps": all_steps})
        out[even] = epochs
        mark(f"sampler even={even} done")
    # Forked workers, as under torchrun: they inherit the process group, so shard_info() sees
    # the rank. (Spawned ranks would default to spawned workers, which inherit neither.)
    loader = DataLoader(
        Stream(N * 3), batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    out["stream"] = [list(x) for x in loader]
    mark("stream read")
    out["datapipe"] = {name: _read_datapipe(cls) for name, cls in
                       (("torch", DataLoader), ("stoker", stoker.DataLoader))}
    return out


def _read_datapipe(loader_cls: type) -> list[list[int]]:
    """Two epochs of a shuffled DataPipe graph: its seed is broadcast from rank 0, and it is
    sharded across ranks x 2 workers."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    torch.manual_seed(dist.get_rank())  # the seed comes from rank 0's global RNG
    pipe = IterableWrapper(range(N * 2)).shuffle(buffer_size=7).sharding_filter()
    loader = loader_cls(pipe, batch_size=None, shuffle=True, num_workers=2,
                        persistent_workers=True, multiprocessing_context="fork")
    epochs = []
    for epoch in range(2):
        epochs.append([int(x) for x in loader])
        mark(f"datapipe {loader_cls.__module__} epoch {epoch}")
    return epochs


def plan_elastic_save(rank: int, world: int) -> dict[str, Any]:
    sampler = ShardedSampler(ELASTIC_N, rank=rank, world_size=world, seed=4, even="exact")
    loader = DataLoader(Indices(ELASTIC_N), batch_size=ELASTIC_BATCH, sampler=sampler)
    read: list[int] = []
    for step, batch in enumerate(loader):
        if step == ELASTIC_STEPS:
            break
        read += batch.tolist()
        sampler.advance(ELASTIC_BATCH)
    dist.barrier()  # a checkpoint is taken with every rank at the same step
    return {"read": read, "state": sampler.state_dict()}


def plan_elastic_load(rank: int, world: int, state: dict[str, Any]) -> dict[str, Any]:
    sampler = ShardedSampler(ELASTIC_N, rank=rank, world_size=world, seed=4, even="exact")
    sampler.load_state_dict(state)
    loader = DataLoader(Indices(ELASTIC_N), batch_size=ELASTIC_BATCH, sampler=sampler)
    read: list[int] = []
    steps = 0
    for batch in even_batches(loader, sampler.num_batches(ELASTIC_BATCH), rank=rank):
        real = [] if isinstance(batch, EndOfData) else batch.tolist()
        dist.all_reduce(torch.tensor([len(real)]))
        read += real
        sampler.advance(ELASTIC_BATCH)
        steps += 1
    return {"read": read, "steps": steps, "state": sampler.state_dict()}


def _stoker_loader() -> Any:
    # stoker's own loader: shard=True builds the ShardedSampler, yields EndOfData on the short
    # ranks, advances the sampler and puts its state in the loader's state_dict.
    return stoker.DataLoader(
        Indices(N), batch_size=BATCH, shuffle=True, shard=True, shard_even="exact",
        num_workers=2, generator=torch.Generator().manual_seed(9), timeout=COLLECTIVE_TIMEOUT_S,
    )


def plan_stoker_loader(rank: int, world: int, state: dict[str, Any] | None) -> dict[str, Any]:
    """A full epoch through stoker.DataLoader(shard=True), or the rest of one after a resume."""
    loader = _stoker_loader()
    if state is not None:
        loader.load_state_dict(state)
    read: list[int] = []
    steps = 0
    saved = None
    for batch in loader:
        real = [] if isinstance(batch, stoker.EndOfData) else batch.tolist()
        dist.all_reduce(torch.tensor([len(real)]))  # would time out if a rank stopped early
        read += real
        steps += 1
        mark(f"stoker loader step {steps}")
        if state is None and steps == 1:
            saved = {"state": loader.state_dict(), "read": list(read)}
    return {"read": read, "steps": steps, "len": len(loader), "saved": saved}


def plan(rank: int, world: int, elastic_state: dict[str, Any] | None,
         loader_state: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything one launch checks (a launch costs seconds: torch is imported per rank)."""
    out = {"shard": plan_shard(rank, world)}
    if elastic_state is None:
        out["elastic_save"] = plan_elastic_save(rank, world)
    else:
        out["elastic_load"] = plan_elastic_load(rank, world, elastic_state)
    mark("elastic done")
    out["stoker_loader"] = plan_stoker_loader(rank, world, loader_state)
    return out


def _rank_main(rank: int, world: int, port: int, out_dir: str, kwargs: dict[str, Any]) -> None:
    torch.set_num_threads(1)  # 2 cores, up to 3 ranks: keep intra-op threads from thrashing
    dist.init_process_group(
        "gloo",
        rank=rank,
        world_size=world,
        init_method=f"tcp://127.0.0.1:{port}",
        timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    mark("joined the process group")
    try:
        result = plan(rank, world, **kwargs)
        dist.barrier()  # nobody tears the group down while a peer still uses it
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    mark("done")


# -- the launcher ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_with_progress(rank: int, main: Any, work: str, *args: Any) -> None:
    """``main(rank, *args)``, marking progress in ``work/progress-rank<r>.txt`` (``mark``); on
    SIGUSR1 the rank writes every thread's stack to ``work/stacks-rank<r>.txt`` (the launcher
    asks when the launch stalls)."""
    global _progress
    with open(os.path.join(work, f"stacks-rank{rank}.txt"), "w") as stacks, \
            open(os.path.join(work, f"progress-rank{rank}.txt"), "w") as progress:
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
        _progress = progress
        mark("started")
        try:
            main(rank, *args)
        finally:
            _progress = None
            faulthandler.unregister(signal.SIGUSR1)


def _progress_size(work: str) -> int:
    """How much progress every rank (and the launcher) has marked so far, in bytes."""
    total = 0
    for name in os.listdir(work):
        if name.startswith("progress-"):
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(work, name))
    return total


def _last_marks(work: str) -> str:
    out = []
    for name in sorted(os.listdir(work)):
        if name.startswith("progress-"):
            lines = Path(work, name).read_text().splitlines()
            out.append(f"{name[len('progress-'):-4]}: {lines[-1] if lines else '(nothing)'}")
    return "\n".join(out)


def _processes(root_pid: int) -> str:
    """The launch's processes (the launcher, its ranks, their workers): pid, state, command."""
    import psutil

    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return "(gone)"
    lines = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            lines.append(f"pid {proc.pid} ({proc.status()}, cpu {sum(proc.cpu_times()[:2]):.1f} s)"
                         f": {' '.join(proc.cmdline())[:200]}")
    return "\n".join(lines)


class _Progress:
    """When a launch last marked progress: ``stalled()`` after ``stall_s`` without any, or
    ``cap_s`` in all."""

    def __init__(self, work: str, stall_s: float, cap_s: float) -> None:
        self.work, self.stall_s, self.cap_s = work, stall_s, cap_s
        self.start = self.last = time.monotonic()
        self.size = _progress_size(work)

    def stalled(self) -> str | None:
        now = time.monotonic()
        size = _progress_size(self.work)
        if size != self.size:
            self.size, self.last = size, now
        if now - self.last >= self.stall_s:
            return f"no progress marked for {now - self.last:.0f} s"
        if now - self.start >= self.cap_s:
            return f"still running after {now - self.start:.0f} s (the cap)"
        return None


def run_ranks(main: Any, args: tuple, world: int, stall_s: float = STALL_S,
              start_method: str = START_METHOD) -> None:
    """``main(rank, *args)`` on ``world`` new processes, started by a fresh launcher process as
    torchrun's agent starts ranks: nothing of this pytest process (its earlier tests' objects,
    threads, garbage) is inherited by a rank. Returns when all ended; raises TimeoutError when
    the launch stalls (no progress marked for ``stall_s``: the ranks are killed, the error
    carries their stacks and last marks), or RuntimeError with the launcher's report when a
    rank failed."""
    with tempfile.TemporaryDirectory(prefix="stoker-launch-") as work:
        job = Path(work, "job.pkl")
        job.write_bytes(pickle.dumps((main, args, world, stall_s, start_method, work)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        launcher = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(job)], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        # The launcher reports a stalled launch itself; this catches a stalled launcher.
        progress = _Progress(work, stall_s + LAUNCHER_SLACK_S, LAUNCH_CAP_S + LAUNCHER_SLACK_S)
        while True:
            try:
                report, _ = launcher.communicate(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                why = progress.stalled()
                if why is None:
                    continue
                processes = _processes(launcher.pid)
                os.killpg(launcher.pid, signal.SIGKILL)  # its session: ranks and workers
                report, _ = launcher.communicate(timeout=30)
                raise TimeoutError(f"the rank launcher: {why}; its last marks:\n"
                                   f"{_last_marks(work)}\nits processes:\n{processes}\n"
                                   f"its output:\n{report[-8000:]}") from None
    if launcher.returncode == 0:
        return
    if "TimeoutError: " in report:
        raise TimeoutError(report[-12000:])
    raise RuntimeError(f"the ranks failed (launcher exit {launcher.returncode}):\n"
                       f"{report[-12000:]}")


def _stacks_of(ctx: Any, work: str, world: int) -> str:
    """Ask every live rank for its stacks (SIGUSR1) and read them, waiting until each has
    written (or ended)."""
    from _polling import poll_until

    alive = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
    for r in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(ctx.processes[r].pid, signal.SIGUSR1)
    files = {r: Path(work, f"stacks-rank{r}.txt") for r in range(world)}
    poll_until(lambda: all(not ctx.processes[r].is_alive()
                           or (files[r].exists() and files[r].stat().st_size > 0)
                           for r in alive), 10)
    return "".join(f"\n--- rank {r}{'' if r in alive else ' (ended)'}:\n"
                   f"{files[r].read_text() if files[r].exists() else ''}"
                   for r in range(world))


def _launch_here(main: Any, args: tuple, world: int, stall_s: float, start_method: str,
                 work: str) -> None:
    """The launcher's part of ``run_ranks``: start the ranks, wait while they progress,
    report."""
    Path(work, "progress-launcher.txt").write_text("started\n")
    ctx = tmp.start_processes(_rank_with_progress, args=(main, work, *args), nprocs=world,
                              join=False, start_method=start_method)
    progress = _Progress(work, stall_s, LAUNCH_CAP_S)
    try:
        while not ctx.join(timeout=POLL_S):
            why = progress.stalled()
            if why is not None:
                running = sum(p.is_alive() for p in ctx.processes)
                processes = _processes(os.getpid())
                raise TimeoutError(
                    f"{running} of {world} ranks still running: {why}; their last marks:\n"
                    f"{_last_marks(work)}\nthe processes:\n{processes}\ntheir stacks:"
                    f"{_stacks_of(ctx, work, world)}")
    finally:
        for proc in ctx.processes:  # kill stragglers (timeout) and release the sentinel fds
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=10)
            proc.close()


def launch(world: int, out_dir: Path, **kwargs: Any) -> list[dict[str, Any]]:
    """Run ``plan`` on ``world`` new ranks; their results, by rank."""
    out_dir.mkdir()
    run_ranks(_rank_main, (world, _free_port(), str(out_dir), kwargs), world)
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


# -- tests -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, Any]]]:
    """One launch at world size 3 (which also saves the elastic checkpoint), then one at 2
    (which resumes it). Both finish, processes joined, before any test's leak check starts."""
    root = tmp_path_factory.mktemp("distributed")
    three = launch(3, root / "w3", elastic_state=None)
    state = three[0]["elastic_save"]["state"]
    loader_state = three[0]["stoker_loader"]["saved"]["state"]
    two = launch(2, root / "w2", elastic_state=state, loader_state=loader_state)
    return {3: three, 2: two}


@pytest.mark.parametrize("world", [2, 3])
def test_context_is_detected_from_the_process_group(
    runs: dict[int, list[dict[str, Any]]], world: int
) -> None:
    assert [r["shard"]["context"] for r in runs[world]] == [
        [rank, world, "process_group"] for rank in range(world)
    ]


@pytest.mark.parametrize("even", ["pad", "drop", "exact"])
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_cover_the_data_and_step_together(
    runs: dict[int, list[dict[str, Any]]], world: int, even: str
) -> None:
    orders = []
    for e in range(2):
        per_rank = [r["shard"][even][e] for r in runs[world]]
        assert {r["epoch"] for r in per_rank} == {e}, "the autopilot bumps the epoch once a pass"
        steps = per_rank[0]["all_steps"]
        assert len(set(steps)) == 1, f"ranks took different step counts: {steps}"
        read = [i for r in per_rank for b in r["batches"] for i in b]
        if even == "exact":
            assert sorted(read) == list(range(N))
        elif even == "pad":  # everything, plus the padding repeats and nothing else
            assert set(read) == set(range(N)) and len(read) == -(-N // world) * world
        else:
            assert len(set(read)) == len(read) == N - N % world
        orders.append(read)
    assert orders[0] != orders[1], "epoch 1 repeated epoch 0's order"


@pytest.mark.parametrize("world", [2, 3])
def test_iterable_dataset_is_read_once_across_ranks_and_workers(
    runs: dict[int, list[dict[str, Any]]], world: int
) -> None:
    stream = [tuple(x) for r in runs[world] for x in r["shard"]["stream"]]
    assert sorted(x for x, _ in stream) == list(range(N * 3))
    assert {shard for _, shard in stream} == set(range(2 * world))  # 2 workers per rank
    assert all(x % (2 * world) == shard for x, shard in stream)


@pytest.mark.parametrize("world", [2, 3])
def test_datapipe_graph_is_sharded_across_ranks_and_workers_like_torch(
    runs: dict[int, list[dict[str, Any]]], world: int
) -> None:
    per_rank = [r["shard"]["datapipe"] for r in runs[world]]
    assert [r["stoker"] for r in per_rank] == [r["torch"] for r in per_rank]
    for epoch in range(2):
        assert sorted(x for r in per_rank for x in r["stoker"][epoch]) == list(range(N * 2))


def test_elastic_resume_from_three_ranks_to_two(runs: dict[int, list[dict[str, Any]]]) -> None:
    saved = [r["elastic_save"] for r in runs[3]]
    states = [r["state"] for r in saved]
    assert all(s == states[0] for s in states), "every rank must save the same state"
    assert states[0]["consumed_global"] == ELASTIC_STEPS * ELASTIC_BATCH * 3
    resumed = [r["elastic_load"] for r in runs[2]]
    before = [i for r in saved for i in r["read"]]
    after = [i for r in resumed for i in r["read"]]
    assert not set(before) & set(after), "a sample read before the checkpoint was read again"
    assert sorted(before + after) == list(range(ELASTIC_N))
    assert len({r["steps"] for r in resumed}) == 1
    assert {r["state"]["consumed_global"] for r in resumed} == {ELASTIC_N}


def test_context_outside_a_process_group_is_a_single_process() -> None:
    if "RANK" in os.environ or dist.is_initialized():
        pytest.skip("the test run itself is distributed")
    assert detect() == DistContext(0, 1)


def test_stoker_loader_shards_a_real_process_group(runs: dict[int, list[dict[str, Any]]]) -> None:
    ranks = [r["stoker_loader"] for r in runs[3]]
    assert len({r["steps"] for r in ranks}) == 1, "every rank takes the same number of steps"
    assert all(r["len"] == r["steps"] for r in ranks)
    read = [i for r in ranks for i in r["read"]]
    assert sorted(read) == list(range(N)), "exact: every sample once across ranks and workers"


def test_stoker_loader_resumes_elastically_from_three_ranks_to_two(
    runs: dict[int, list[dict[str, Any]]],
) -> None:
    before = [i for r in runs[3] for i in r["stoker_loader"]["saved"]["read"]]
    after = [i for r in runs[2] for i in r["stoker_loader"]["read"]]
    assert len(before) == 3 * BATCH
    assert not set(before) & set(after), "a sample read before the checkpoint was read again"
    assert sorted(before + after) == list(range(N))
    assert len({r["stoker_loader"]["steps"] for r in runs[2]}) == 1


if __name__ == "__main__":  # run_ranks' launcher: python test_distributed.py JOB
    # From the importable module, not this __main__ copy: ``mark`` (called by the job's
    # functions, which unpickle from there) and ``_rank_with_progress`` share one ``_progress``.
    import test_distributed

    test_distributed._launch_here(*pickle.loads(Path(sys.argv[1]).read_bytes()))
