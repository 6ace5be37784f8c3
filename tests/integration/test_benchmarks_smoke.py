"""`benchmarks/run.py --quick` runs every workload, prints parseable JSON records for both
loaders, and writes the same records with --json-out. Timings are never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("PIL", reason="the jpeg workload needs pillow")
pytest.importorskip("psutil", reason="PSS sampling needs psutil")

RUNNER = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"
WORKLOADS = {
    "tiny", "jpeg", "remote_get", "stragglers", "startup", "paths_memory", "paths_memory_shared",
    "spawn_array", "packed", "per_sample", "image_path", "vision",
}
# `packed` also measures two controls: stoker's loader on the files, webdataset on the shards.
CONTROLS = {"stoker per-file", "webdataset"}


# A ~60 s run on a quiet machine; the limits only catch a hang, never a slow machine.
@pytest.mark.timeout(900)
def test_quick_run_prints_a_record_per_workload_and_loader(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--quick", "--json-out", str(out)],
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert {r["workload"] for r in records} == WORKLOADS
    assert {r["loader"] for r in records} - CONTROLS == {"torch", "stoker"}
    for record in records:
        assert record["samples_per_s"] > 0, record
        assert record["time_to_first_batch_s"] > 0, record
        assert record["peak_pss_mib"] > 0, record
        assert set(record["machine"]) >= {"cpu_count", "python", "torch"}, record
    pairs = {(r["workload"], r["variant"], r["loader"]) for r in records}
    compared = [p for p in pairs if p[2] not in CONTROLS]
    assert len(pairs) == len(records)
    assert len(compared) == 2 * len({(w, v) for w, v, _ in compared})
    assert json.loads(out.read_text())["records"] == records
    assert "stoker/torch ratios" in proc.stdout


def test_gpu_feed_benchmark_says_why_not_without_cuda() -> None:
    """Without CUDA it says why and exits 0; its code paths run in
    test_gpu_feed_dry_run.py, its figures on a GPU machine (scripts/gpu_check.sh)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("with CUDA the benchmark is scripts/gpu_check.sh's (several minutes)")
    script = RUNNER.parent / "gpu_feed.py"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert records == [{"workload": "gpu_feed", "skipped": (
        f"skipped: CUDA is not available (torch {torch.__version__}); these benchmarks "
        "measure host-to-device copies and GPU decoding (--dry-run runs their code paths on "
        "the CPU)")}]


def test_remote_shards_benchmark_reads_every_sample_with_each_loader() -> None:
    script = RUNNER.parent / "remote_shards.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--samples", "200", "--per-shard", "50",
         "--per-file-limit", "40", "--latency-ms", "0", "--no-peers"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    records = {r["loader"]: r for r in map(json.loads, proc.stdout.splitlines())}
    streams = ("stoker_stream", "stoker_stream_unindexed")
    s3fs = ("stoker_packed_shards_s3fs", "stoker_stream_s3fs")  # the default's other client
    assert set(records) == {"torch_per_file", "stoker_packed_shards", "stoker_packed_ranges",
                            *streams, *s3fs, "network_bound"}
    assert records["torch_per_file"]["samples"] == 40
    for name in ("stoker_packed_shards", "stoker_packed_ranges", *streams, *s3fs):
        record = records[name]
        assert record["samples"] == 200 and record["gets"] > 0, record
        assert 0 < record["time_to_first_batch_s"] < record["epoch_s"], record
        assert record["steady_fraction_of_bound"] > 0, record
        assert record["loader_cpu_s"] > 0 and "server_cpu_s" in record, record
    assert records["stoker_packed_shards"]["gets"] == 2 + 4  # manifest, indexes, shards
    assert records["stoker_stream"]["gets"] == 2 + 4  # manifest, indexes, shards
    assert records["stoker_stream_unindexed"]["gets"] == 4
    assert records["stoker_packed_shards_s3fs"]["gets"] == 2 + 4
