"""An error in ``__getitem__`` names the sample index that raised, first, then its batch, the
worker and its pid; the dataset's exception keeps all its attributes (NOTE [ The sample that
raised ] in ``stoker.fetch.fetchers``). Every executor: the calling thread, worker processes
(one fetch at a time and on their thread pool), and ``worker_type="thread"``."""

from __future__ import annotations

import errno
import json
import os
import re

import pytest
import torch

from stoker import DataLoader

N, BATCH, FAIL = 256, 64, 137  # 137 is the 10th sample of the third batch, [128 .. 191]
SHOWN = list(range(128, 144))  # the first 16 of that batch, as the note lists them


class MissingFileDS(torch.utils.data.Dataset):
    """Opens a file that does not exist at sample ``FAIL``, after writing down who did it."""

    def __init__(self, missing: str, record: str) -> None:
        self.missing, self.record = missing, record

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        if i == FAIL:
            info = torch.utils.data.get_worker_info()
            with open(self.record, "a") as fh:
                fh.write(json.dumps({"worker": info.id if info else None, "pid": os.getpid()}))
            open(self.missing)  # noqa: SIM115 - raises FileNotFoundError
        return i


class NotAtPosition(MissingFileDS):
    """A ``__getitems__`` dataset: stoker hands it the whole batch, so no single index is
    known."""

    def __getitems__(self, indices: list[int]) -> list[int]:
        return [self[i] for i in indices]


def _raised(tmp_path, cls=MissingFileDS, **kwargs) -> tuple[FileNotFoundError, dict]:
    missing, record = str(tmp_path / "missing.jpg"), str(tmp_path / "who.json")
    loader = DataLoader(cls(missing, record), batch_size=BATCH, **kwargs)
    with pytest.raises(FileNotFoundError) as info:
        for _ in loader:
            pass
    exc = info.value
    del info, loader
    with open(record) as fh:
        who = json.load(fh)
    assert (exc.errno, exc.strerror, exc.filename, exc.filename2) == (
        errno.ENOENT, os.strerror(errno.ENOENT), missing, None)
    assert str(exc) == f"[Errno {errno.ENOENT}] {os.strerror(errno.ENOENT)}: {missing!r}"
    exc.__traceback__ = exc.__cause__ = exc.__context__ = None  # free the frames
    return exc, who


BATCH_TEXT = f"sample indices {SHOWN} ... ({BATCH} in all)"


@pytest.mark.parametrize("kwargs", [{}, {"worker_concurrency": 4}], ids=["one", "threads"])
def test_worker_note_names_the_raising_index_first(tmp_path, kwargs):
    exc, who = _raised(tmp_path, num_workers=2, **kwargs)
    assert exc.__notes__ == [
        f"stoker: raised in DataLoader worker {who['worker']} (pid {who['pid']}) while loading "
        f"sample index {FAIL} (its batch: {BATCH_TEXT}); the worker's traceback is chained above."
    ]


def test_main_process_note_names_the_raising_index_first(tmp_path):
    exc, _ = _raised(tmp_path, num_workers=0)
    assert exc.__notes__ == [
        f"stoker: raised in the main process (num_workers=0) while loading sample index {FAIL} "
        f"(its batch: {BATCH_TEXT})."
    ]


@pytest.mark.parametrize(
    "concurrency,where", [(1, "the calling thread"), (4, "a fetch thread")], ids=["one", "pool"])
def test_thread_workers_note_names_the_raising_index_first(tmp_path, concurrency, where):
    exc, _ = _raised(tmp_path, num_workers=2, worker_type="thread",
                     worker_concurrency=concurrency)
    assert exc.__notes__ == [
        f"stoker: raised in {where} while loading sample index {FAIL} (its batch: {BATCH_TEXT})."
    ]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_getitems_dataset_note_names_the_batch(tmp_path, num_workers):
    """``__getitems__`` gets the whole batch: the note names the batch, never a guessed index."""
    exc, who = _raised(tmp_path, NotAtPosition, num_workers=num_workers)
    where = (f"in DataLoader worker {who['worker']} (pid {who['pid']})" if num_workers
             else "in the main process (num_workers=0)")
    tail = "; the worker's traceback is chained above." if num_workers else "."
    assert exc.__notes__ == [f"stoker: raised {where} while loading {BATCH_TEXT}{tail}"]


class SkipThenBadCollate(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i == 1:
            raise ValueError("sample 1 is corrupt")
        return i


def _collate_fails_on_second_batch(batch: list[int]) -> torch.Tensor:
    if 4 in batch:
        raise TypeError("collate cannot take this batch")
    return torch.tensor(batch)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_collate_error_after_a_skipped_sample_names_no_sample(num_workers):
    """A sample skipped in one batch is not blamed for the next batch's collate error."""
    loader = DataLoader(SkipThenBadCollate(), batch_size=4, num_workers=num_workers,
                        on_error="skip", skip_budget=1,
                        collate_fn=_collate_fails_on_second_batch)
    with pytest.raises(TypeError) as info:
        for _ in loader:
            pass
    exc = info.value
    del info, loader
    notes = exc.__notes__
    exc.__traceback__ = exc.__cause__ = exc.__context__ = None
    if num_workers:
        (note,) = notes
        assert re.fullmatch(
            r"stoker: raised in DataLoader worker 0 \(pid \d+\) while loading sample indices "
            r"\[4, 5, 6, 7\]; the worker's traceback is chained above\.", note), note
    else:
        assert notes == [
            "stoker: raised in the main process (num_workers=0) while loading sample indices "
            "[4, 5, 6, 7]."
        ]
