"""Hugging Face ``Trainer`` (tiny model, CPU) on a stoker loader: training and the mid-epoch
resume (``skip_first_batches``) both fetch through stoker's workers."""

from __future__ import annotations

from pathlib import Path

from _launch import need, records, run


def test_trainer_and_its_resume_run_on_stoker(tmp_path: Path) -> None:
    need("transformers", "accelerate")
    run("trainer_run.py", tmp_path)
    (record,) = records(tmp_path)
    # Every sample of every batch came from a stoker worker (1.0); torch's would say 0.0.
    assert record["first"] == [[1.0, 1.0]] * 4
    assert record["resumed"] == [[1.0, 1.0]] * 2  # 4 steps, resumed after 2
