"""``stoker pack`` on real files with real worker processes: what it writes reads back exactly
(through stoker's reader and through WebDataset's own, when installed), a pack killed midway
resumes keeping its finished shards, ``--verify`` finds a damaged shard, ``--max-side``
re-encodes images and records it."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
from _pack_datasets import BLOCK_ENV, N, Records

from _polling import poll_until
from stoker.cli import main as cli_main
from stoker.errors import PackError
from stoker.formats import ImageFolder, ShardError, TarShards, pack, verify_pack
from stoker.formats.tar_index import load_index, tables_to_bytes
from stoker.storage import LocalSource

PIL = pytest.importorskip("PIL.Image")
KILL_DEADLINE_S = 60.0
HERE = Path(__file__).resolve().parent


def make_folder(root: Path, sizes: list[tuple[int, int]]) -> Path:
    rng = np.random.default_rng(0)
    for i, (w, h) in enumerate(sizes):
        cls = root / ("cat" if i % 2 else "dog")
        cls.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        PIL.fromarray(pixels).save(cls / f"img.{i}.jpg", quality=90)  # a dot in the name
    (root / "dog" / "notes.txt").write_text("not an image")
    return root


def test_image_folder_packs_and_reads_back_exactly(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "imgs", [(40 + i, 30) for i in range(13)])
    summary = pack(str(root), str(tmp_path / "out"), samples_per_shard=4, workers=2,
                   verify=True, progress=False)
    assert (summary.samples, summary.shards, summary.shards_kept) == (13, 4, 0)
    assert summary.verified
    files = ImageFolder(str(root), decode="bytes")
    packed = TarShards(str(tmp_path / "out"))
    assert len(packed) == len(files) == 13
    for i in range(13):
        sample = packed[i]
        data, label = files[i]
        assert (sample["jpg"], int(sample["cls"])) == (data, label)
        assert sample["path.txt"].decode() == files.paths[i]
    assert summary.size_bytes == sum(s.size_bytes for s in packed.shards)
    assert str(summary).startswith(
        f"packed 13 samples into 4 shards ({summary.size_bytes / 1e6:.1f} MB) in "
        f"{tmp_path / 'out'}: 13 samples in "
    )


def test_webdataset_reads_the_same_shards(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    pack(str(make_folder(tmp_path / "imgs", [(32, 32)] * 9)), str(tmp_path / "out"),
         samples_per_shard=4, workers=1, progress=False)
    ours = TarShards(str(tmp_path / "out"))
    urls = [s.path for s in ours.shards]
    theirs = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert [(t["__key__"], t["jpg"], t["cls"]) for t in theirs] == [
        (s["__key__"], s["jpg"], s["cls"]) for s in (ours[i] for i in range(len(ours)))
    ]


def _run_pack_cli(out: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env.update(dict(e.split("=", 1) for e in extra if "=" in e and e.startswith("STOKER_")))
    args = [a for a in extra if not a.startswith("STOKER_")]
    return subprocess.Popen(
        [sys.executable, "-m", "stoker.cli", "pack", "_pack_datasets:records", str(out),
         "--samples-per-shard", "10", "--no-progress", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )


def test_killed_pack_resumes_keeping_finished_shards(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _run_pack_cli(out, "--workers", "1", f"{BLOCK_ENV}=25")
    done = [out / f"shard-00000{k}.tar.idx.npz" for k in (0, 1)]
    try:
        # Poll for the files (no timing assumed): shards 0-1 finished, shard 2 blocked at 25.
        at_shard_2 = poll_until(
            lambda: proc.poll() is not None or (
                all(p.exists() for p in done) and (out / "shard-000002.tar.partial").exists()),
            KILL_DEADLINE_S)
        assert proc.poll() is None, proc.communicate(timeout=10)
        assert at_shard_2, "the pack never got to shard 2"
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert workers
        os.kill(proc.pid, signal.SIGKILL)  # the driver only, as the OOM killer would
        proc.communicate(timeout=30)
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"pack workers outlived their driver: {alive}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left, if the test failed
    assert not (out / "index.json").exists()
    kept = {k: os.stat(out / f"shard-00000{k}.tar") for k in (0, 1)}
    summary = pack(Records(), str(out), samples_per_shard=10, workers=2, progress=False)
    assert (summary.samples, summary.shards, summary.shards_kept) == (N, 4, 2)
    assert summary.packed_samples == 20
    for k, before in kept.items():
        after = os.stat(out / f"shard-00000{k}.tar")
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert not list(out.glob("*.partial"))
    fresh = tmp_path / "fresh"
    pack(Records(), str(fresh), samples_per_shard=10, workers=1, progress=False)
    for k in range(4):  # shard bytes do not depend on the run that wrote them
        name = f"shard-00000{k}.tar"
        assert (out / name).read_bytes() == (fresh / name).read_bytes(), name
    _assert_records(TarShards(str(out)))


def _assert_records(packed: TarShards) -> None:
    assert len(packed) == N
    for i in range(N):
        sample = packed[i]
        assert np.array_equal(np.load(io.BytesIO(sample["npy"])), np.arange(i, dtype=np.int32))
        assert (sample["cls"], sample["txt"], sample["__key__"]) == (
            str(i % 5).encode(), f"sample {i}".encode(), f"{i:09d}")


def test_cli_packs_a_dataset_factory_and_verifies(tmp_path: Path) -> None:
    proc = _run_pack_cli(tmp_path / "out", "--verify", "--workers", "2")
    stdout, stderr = proc.communicate(timeout=KILL_DEADLINE_S)
    assert proc.returncode == 0, stderr.decode()
    assert stdout.decode().endswith("samples/s; verified: every sample re-read, counts and "
                                    "CRC-32s match\n")
    _assert_records(TarShards(str(tmp_path / "out")))


def test_verify_names_a_damaged_shard(tmp_path: Path) -> None:
    out = tmp_path / "out"
    pack(Records(), str(out), samples_per_shard=10, workers=1, progress=False)
    shard = out / "shard-000001.tar"
    raw = bytearray(shard.read_bytes())
    offset = TarShards(str(out)).locate(13).fields["txt"][0]
    raw[offset] ^= 1
    shard.write_bytes(bytes(raw))
    with pytest.raises(ShardError) as info:
        verify_pack(str(out))
    assert str(info.value) == (
        f"{out}: 1 of 4 shards failed verification:\n  {shard}: its contents (10 samples, "
        f"{len(raw)} bytes) differ from its index (10 samples, {len(raw)} bytes, or other "
        "offsets or CRC-32s)\nre-create them: delete those shards and their .idx.npz files "
        "and run the same stoker pack again (it redoes only missing shards)"
    )
    assert cli_main(["pack", "--no-progress", "--samples-per-shard", "10", str(tmp_path),
                     str(out)]) == 1  # not an image folder, and out holds another pack


def test_verify_finds_a_file_of_indexes_that_differs_from_the_sidecars(tmp_path: Path) -> None:
    out = tmp_path / "out"
    pack(Records(), str(out), samples_per_shard=10, workers=1, progress=False)
    manifest = json.loads((out / "index.json").read_text())
    assert manifest["tables"] == "index.tables.npz"
    assert manifest["tables_bytes"] == (out / "index.tables.npz").stat().st_size
    tables = [load_index(LocalSource(), str(out / s["path"])) for s in manifest["shards"]]
    (out / "index.tables.npz").write_bytes(tables_to_bytes(tables[1:2] + tables[1:]))
    with pytest.raises(ShardError) as info:
        verify_pack(str(out))
    assert f"{out}/index.tables.npz: the index of {out}/shard-000000.tar differs from its " \
        "sidecar" in str(info.value)
    assert str(info.value).startswith(f"{out}: 1 of 4 shards failed verification")


def test_tuple_samples_need_field_names(tmp_path: Path) -> None:
    from _pack_datasets import pairs

    with pytest.raises(PackError) as info:
        pack(pairs(), str(tmp_path / "a"), workers=1, progress=False)
    assert str(info.value) == (
        "sample 0 of list: it is a tuple of 2 elements; stoker pack needs a dict of "
        "{extension: value} (e.g. {'jpg': jpeg_bytes, 'cls': 3}), or a tuple with one field "
        "name per element: fields=('jpg', 'cls') (--fields jpg,cls); fields given: []"
    )
    pack(pairs(), str(tmp_path / "b"), workers=1, progress=False, fields=("bin", "cls"))
    packed = TarShards(str(tmp_path / "b"))
    assert [(packed[i]["bin"], packed[i]["cls"]) for i in range(7)] == [
        (b"x" * i, str(i).encode()) for i in range(7)]


def test_max_side_reencodes_large_images_and_records_it(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "imgs", [(300, 200), (50, 40), (120, 160)])
    pack(str(root), str(tmp_path / "out"), workers=1, max_side=100, jpeg_quality=85,
         progress=False)
    packed = TarShards(str(tmp_path / "out"))
    assert packed.meta["max_side"] == 100 and packed.meta["jpeg_quality"] == 85
    assert packed.table(0).meta == packed.meta
    files = ImageFolder(str(root), decode="bytes")
    sizes = []
    for i in range(3):
        with PIL.open(io.BytesIO(packed[i]["jpg"])) as image:
            sizes.append(image.size)
        if files[i][0] == packed[i]["jpg"]:
            sizes[-1] = ("unchanged", *sizes[-1])
    original = {PIL.open(root / p).size: p for p in files.paths}
    assert sorted(sizes, key=str) == sorted(
        [(100, 67), ("unchanged", 50, 40), (75, 100)], key=str), (sizes, original)
    plan = json.loads((tmp_path / "out" / "pack.json").read_text())
    assert (plan["max_side"], plan["jpeg_quality"]) == (100, 85)
    assert packed.meta["resample"] == (
        "bicubic; nearest for modes P, 1, I, I;16, F and for lossless prefixed fields")


def _advice(out: Path, kept: int, shards: int, what: str = "sample") -> str:
    fix = {"sample": "fix the sample in the dataset",
           "file": "fix or replace the file, keeping its name"}[what]
    return (
        f"\n{kept} of {shards} shards are finished and kept in {out}. To go on, {fix}, and run "
        f"the same pack again: it resumes. Removing the {what} instead renumbers the samples "
        "after it, so the pack must start over in a new or empty directory"
    )


@pytest.mark.parametrize(("samples", "problem"), [
    ([{"__key__": f"img.{i}", "txt": "t"} for i in range(6)],
     "sample 0 of list: its __key__ 'img.0' has a dot in its last path part: readers split the "
     "member name there, so it would read back as 'img'; give it a key such as 'img_0' or "
     "'train/000001'"),
    ([{"__key__": f"k{i // 2}", "txt": f"t{i}"} for i in range(6)],
     "sample 1 of list: its __key__ 'k0' is the key of sample 0 too, and adjacent samples with "
     "one key read back as one sample; give every sample its own key"),
    ([{"txt": "a"}, {}, {"txt": "c"}],
     "sample 1 of list: it has no fields ([]); every sample needs at least one, such as "
     "{'jpg': jpeg_bytes} (a sample without members reads back as none)"),
])
def test_samples_that_would_read_back_merged_or_lost_are_refused(
        tmp_path: Path, samples: list[dict[str, str]], problem: str) -> None:
    out = tmp_path / "out"
    with pytest.raises(PackError) as info:
        pack(samples, str(out), samples_per_shard=10, workers=2, progress=False)
    assert str(info.value) == problem + _advice(out, 0, 1)
    assert sorted(os.listdir(out)) == ["pack.json"]  # no shard, no leftover .partial


def test_a_shard_that_reads_back_fewer_samples_than_written_is_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import stoker.formats._records as records

    monkeypatch.setattr(records, "check_key", lambda key: key)  # forked workers inherit it
    out = tmp_path / "out"
    samples = [{"__key__": "k", "txt": "a"}, {"__key__": "k.1", "txt": "b"}]
    with pytest.raises(PackError) as info:
        pack(samples, str(out), samples_per_shard=10, workers=1, progress=False)
    assert str(info.value) == (
        f"{out}/shard-000000.tar: 2 samples written, but reading it back finds 1; the shard is "
        "removed. Their keys or field names break the rules of NOTE [ Keys and fields in a tar "
        "] in a way stoker pack did not catch: please report it" + _advice(out, 0, 1)
    )
    assert sorted(os.listdir(out)) == ["pack.json"]


def test_a_bad_file_stops_the_pack_at_once_and_a_fixed_one_resumes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_folder(tmp_path / "imgs", [(60, 50)] * 12)
    bad = root / ImageFolder(str(root)).paths[5]  # in shard 2 of 6
    good = bad.read_bytes()
    bad.write_bytes(b"not an image")
    out = tmp_path / "out"
    args = ["pack", str(root), str(out), "--samples-per-shard", "2", "--workers", "1",
            "--max-side", "40", "--no-progress"]
    assert cli_main(args) == 1
    assert capsys.readouterr().err == (
        f"stoker pack: sample 5 ({bad}): field 'jpg' is not an image Pillow can read "
        "(UnidentifiedImageError), so --max-side cannot resize it" + _advice(out, 2, 6, "file")
        + "\n"
    )
    # shard 3, already queued to the one worker, stopped at its first sample; 4-5 cancelled
    assert sorted(p.name for p in out.glob("shard-*.tar")) == [
        "shard-000000.tar", "shard-000001.tar"]
    assert not list(out.glob("*.partial"))
    bad.write_bytes(good)
    summary = pack(str(root), str(out), samples_per_shard=2, workers=2, max_side=40,
                   progress=False)
    assert (summary.samples, summary.shards_kept, summary.packed_samples) == (12, 2, 8)


class KillsItsWorker(Records):
    """Sample ``kill_at`` kills the pack worker that reads it, as the OOM killer would."""

    def __init__(self, kill_at: int | None) -> None:
        super().__init__()
        self.kill_at, self.driver = kill_at, os.getpid()

    def __getitem__(self, i: int) -> dict[str, object]:
        if i == self.kill_at and os.getpid() != self.driver:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


def test_a_killed_worker_says_the_pack_was_interrupted_and_a_rerun_resumes(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(PackError) as info:
        pack(KillsItsWorker(25), str(out), samples_per_shard=10, workers=1, progress=False)
    assert str(info.value) == (
        "stoker pack was interrupted: a worker process died (killed, or out of memory: see "
        f"dmesg); 2 of 4 shards are finished and kept in {out}: run the same pack again to "
        "resume"
    )
    summary = pack(KillsItsWorker(None), str(out), samples_per_shard=10, workers=2,
                   progress=False)
    assert (summary.samples, summary.shards_kept) == (N, 2)
    _assert_records(TarShards(str(out)))


def test_non_utf8_file_names_are_packed_with_their_bytes(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "imgs", [(20, 20)] * 2)
    name = os.fsdecode(b"caf\xe9.jpg")
    (root / "cat" / "img.1.jpg").rename(root / "cat" / name)
    pack(str(root), str(tmp_path / "out"), workers=1, progress=False)
    packed = TarShards(str(tmp_path / "out"))
    assert sorted(bytes(packed[i]["path.txt"]) for i in range(2)) == [
        b"cat/caf\xe9.jpg", b"dog/img.0.jpg"]


def test_output_directories_stoker_pack_cannot_use_are_refused_with_what_to_do(
        tmp_path: Path) -> None:
    root = make_folder(tmp_path / "imgs", [(20, 20)] * 2)
    with pytest.raises(PackError) as inside:
        pack(str(root), str(root / "shards"), workers=1, progress=False)
    assert str(inside.value) == (
        f"{root / 'shards'} is inside the image folder {root}: the pack would become part of "
        "what it packs (a class directory, or files listed next time); pack into a directory "
        "outside it"
    )
    assert not (root / "shards").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError) as file:
        pack(str(root), str(tmp_path / "file"), workers=1, progress=False)
    assert str(file.value) == (
        f"{tmp_path / 'file'} is a file, not a directory; the output of stoker pack is a "
        "directory of shards: give a new or empty directory"
    )
    out = tmp_path / "out"
    pack(str(root), str(out), workers=1, progress=False)
    (out / "pack.json").unlink()
    with pytest.raises(FileExistsError) as planless:
        pack(str(root), str(out), workers=1, progress=False)
    assert str(planless.value) == (
        f"{out} holds a finished pack (index.json, 4 files) but not its plan pack.json, so "
        f"stoker pack cannot tell what it packed: read it as it is (stoker.formats.TarShards("
        f"'{out}')), or delete the directory or pack into another one to pack again"
    )


def test_the_shard_size_probe_measures_images_after_max_side(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "imgs", [(400, 400)] * 4)
    out = tmp_path / "out"
    pack(str(root), str(out), shard_size_mb=0.05, max_side=16, workers=1, progress=False)
    per_shard = json.loads((out / "pack.json").read_text())["samples_per_shard"]
    packed = TarShards(str(out))
    mean = sum(len(v) + 1024 for i in range(4) for k, v in packed[i].items()
               if not k.startswith("__")) / 4
    assert per_shard == int(0.05 * 2**20 // mean) > 4  # 1, measured before resizing


def test_repacking_tar_shards_packs_no_reader_metadata(tmp_path: Path) -> None:
    pack(Records(), str(tmp_path / "a"), samples_per_shard=10, workers=1, progress=False)
    pack(TarShards(str(tmp_path / "a")), str(tmp_path / "b"), samples_per_shard=10, workers=1,
         progress=False)
    assert set(TarShards(str(tmp_path / "b")).table(0).fields) == {"cls", "npy", "txt"}
    _assert_records(TarShards(str(tmp_path / "b")))
