"""Datasets correct under torch's DataLoader give torch's results with stoker's defaults
(issue 17): nothing that assumes something about the user's code runs unless the user says so.

Each test runs against ``STOKER_TEST_LOADER=torch`` too: the expectations are torch's.
"""

from __future__ import annotations

import pytest
import torch
from _user_datasets import (
    RECORD_BYTES,
    AlarmGuarded,
    BatchNormalised,
    Labelled,
    LateJitter,
    ListUser,
    RecordFile,
    SqliteRows,
    write_records,
    write_sqlite,
)

import stoker


def test_a_shared_file_handle_read_with_seek_and_read_gives_every_sample_its_own_bytes(
    Loader, tmp_path
):
    path = str(tmp_path / "records.bin")
    write_records(path, 96)
    batches = list(Loader(RecordFile(path, 96), batch_size=8, num_workers=2, timeout=60))
    got = torch.cat(batches)
    assert got.shape == (96, RECORD_BYTES // 4)
    wrong = [i for i in range(96) if not bool((got[i] == i).all())]
    assert wrong == []


def test_a_lazily_opened_sqlite_connection_is_used_by_the_thread_that_opened_it(
    Loader, tmp_path
):
    path = str(tmp_path / "samples.db")
    write_sqlite(path, 96)
    batches = list(Loader(SqliteRows(path, 96), batch_size=8, num_workers=2, timeout=60))
    assert torch.cat(batches).tolist() == [7 * i for i in range(96)]


def test_a_sigalrm_timeout_in_getitem_works(Loader):
    batches = list(Loader(AlarmGuarded(96), batch_size=8, num_workers=2, timeout=60))
    assert torch.cat(batches).tolist() == list(range(96))


def test_a_late_draw_from_random_is_the_same_in_every_run_with_the_same_seed(Loader):
    def run() -> list[list[int]]:
        gen = torch.Generator().manual_seed(3)
        loader = Loader(LateJitter(160, late=80), batch_size=8, num_workers=2, generator=gen,
                        timeout=60)
        return torch.cat(list(loader)).tolist()

    first, second, third = run(), run(), run()
    assert [row[0] for row in first] == list(range(160))
    assert sum(row[1] != 0 for row in first) == 80  # the jitter was drawn
    assert second == first and third == first


def test_a_getitem_that_reduces_over_its_input_is_called_per_sample(Loader):
    dataset = BatchNormalised(1024)
    expected = torch.stack([dataset[i] for i in range(1024)])
    for num_workers in (0, 2):
        got = torch.cat(list(Loader(dataset, batch_size=64, num_workers=num_workers)))
        differ = (got != expected).any(dim=1).sum().item()
        assert differ == 0, f"num_workers={num_workers}: {differ} samples differ"


# -- on_error="skip" (stoker only: torch has no error policy) ----------------------------------


class _RunsOutOfMemory(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> int:
        if i == 5:
            raise MemoryError("cannot allocate 8 GiB for sample 5")
        return i


class _BadBatch(torch.utils.data.Dataset):
    """Samples 4-7 (the whole second batch of 4) are corrupt."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> int:
        if 4 <= i < 8:
            raise ValueError(f"corrupt sample {i}")
        return i


_EXECUTORS = [{"num_workers": 0}, {"num_workers": 2}, {"worker_type": "thread"}]


@pytest.mark.parametrize("executor", _EXECUTORS, ids=["inline", "process", "thread"])
def test_skip_does_not_count_running_out_of_memory_as_a_bad_sample(stoker_only, executor):
    loader = stoker.DataLoader(_RunsOutOfMemory(), batch_size=4, on_error="skip",
                               skip_budget=4, **executor)
    with pytest.raises(MemoryError, match="cannot allocate 8 GiB for sample 5"):
        list(loader)
    assert loader.stats().skipped == 0


@pytest.mark.parametrize("executor", _EXECUTORS, ids=["inline", "process", "thread"])
def test_an_epoch_shortened_by_a_fully_skipped_batch_says_so(stoker_only, executor):
    loader = stoker.DataLoader(_BadBatch(), batch_size=4, on_error="skip", skip_budget=4,
                               **executor)
    with pytest.warns(RuntimeWarning) as caught:
        batches = list(loader)
    assert len(loader) == 4 and len(batches) == 3
    assert [str(w.message) for w in caught if "not yielded" in str(w.message)] == [
        "on_error='skip' skipped every sample of batch 1, so it is not yielded: this epoch "
        "has fewer batches than len(loader) = 4. loader.stats().empty_batches counts such "
        "batches; a training loop that relies on len(loader) steps per epoch (a learning-rate "
        "schedule, DDP) should not rely on it with on_error='skip'."
    ]
    assert (loader.stats().skipped, loader.stats().empty_batches) == (4, 1)


# -- large lists reach workers unchanged ------------------------------------------------------


def test_a_list_retyped_in_place_between_epochs_is_seen_retyped_in_workers(Loader):
    labels = list(range(70_000))  # held by the script too: the workers get a shared copy
    loader = Loader(Labelled(labels), batch_size=None, num_workers=2, persistent_workers=False)
    first = list(loader)
    assert first == [["int", i] for i in range(8)]  # default_convert: tuples become lists
    for k in range(len(labels)):  # fixed up in place: ints become floats, all still equal
        labels[k] = float(labels[k])
    assert list(loader) == [["float", float(i)] for i in range(8)]


def test_a_large_list_in_a_worker_behaves_as_the_list(Loader):
    dataset = ListUser()
    expected = [tuple(dataset[i]) for i in range(4)]
    got = [tuple(int(v) if isinstance(v, torch.Tensor) else v for v in sample)
           for sample in Loader(dataset, batch_size=None, num_workers=2)]
    assert got == expected
