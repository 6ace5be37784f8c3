"""The per-batch timeline with real worker processes: each worker's stages line up with the
main process's clock, and torch.profiler sees the main process receive batches."""

from __future__ import annotations

import torch

import stoker


class _Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16,), float(i))


def test_worker_batches_are_timed_on_the_main_clock() -> None:
    loader = stoker.DataLoader(_Rows(), batch_size=8, num_workers=2, worker_type="process",
                               timeout=30)
    recorder = loader.record_timeline()
    batches = list(loader)
    assert len(batches) == 12
    worker = recorder.worker_batches()
    assert len(worker) == 12 and {w.worker_id for w in worker} == {0, 1}
    steps = recorder.steps()
    start, end = steps[0].entered, steps[-1].left
    for w in worker:
        assert w.fetch_start <= w.collate_start <= w.pack_start <= w.sent <= w.received
        # one clock: a worker's batch is made after the loop first asked and before it ended
        assert start - 5.0 < w.fetch_start and w.received <= end
    unpacks = [m for m in recorder.main_stages() if m.name == "unpack"]
    assert len(unpacks) == 12


def test_profiler_sees_receiving_from_workers() -> None:
    loader = stoker.DataLoader(_Rows(), batch_size=8, num_workers=2, worker_type="process",
                               timeout=30, beyond_torch={"profiler_ranges"})
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert len(list(loader)) == 12
    names = [e.name for e in prof.events()]
    assert names.count("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__") == 13
    assert names.count("stoker: receive batch from worker") == 12
    assert names.count("stoker: next()") == 13
