"""Datasets correct under torch's DataLoader give torch's results with stoker's defaults
(issue 17): nothing that assumes something about the user's code runs unless the user says so.

Each test runs against ``STOKER_TEST_LOADER=torch`` too: the expectations are torch's.
"""

from __future__ import annotations

import torch
from _user_datasets import (
    RECORD_BYTES,
    AlarmGuarded,
    BatchNormalised,
    LateJitter,
    RecordFile,
    SqliteRows,
    write_records,
    write_sqlite,
)


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
