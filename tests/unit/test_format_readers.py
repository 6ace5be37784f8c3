"""Every reader over the same dataset written with its format's own writer (real files): it
gives exactly the dataset's samples, in order, and indexes like a list."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))
from _format_files import N, expected, sample_of, write_all  # noqa: E402

from stoker.errors import ShardError  # noqa: E402

READERS = ["tar", "parquet", "arrow", "tfrecord", "lmdb", "image_folder"]


@pytest.fixture(scope="module")
def readers(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return write_all(str(tmp_path_factory.mktemp("formats")))


@pytest.mark.parametrize("name", READERS)
def test_reader_gives_exactly_the_datasets_samples(readers: dict, name: str) -> None:
    dataset = readers[name]()
    assert len(dataset) == N
    assert [sample_of(name, dataset, i) for i in range(N)] == expected(name)
    assert sample_of(name, dataset, -1) == expected(name)[-1]
    shuffled = [7, 0, 22, 3, 19, 11, 12]  # across files, row groups and back
    assert [sample_of(name, dataset, i) for i in shuffled] == [expected(name)[i] for i in shuffled]
    with pytest.raises(IndexError):
        dataset[N]


def test_tfrecord_without_index_says_how_to_make_one(readers: dict, tmp_path: Path) -> None:
    from stoker.formats import TFRecordDataset

    path = str(tmp_path / "x.tfrecord")
    with pytest.raises(FileNotFoundError) as info:
        TFRecordDataset(path)
    assert str(info.value) == (
        f"{path}: no record index at {path}.index; random access needs one: python -m "
        f"tfrecord.tools.tfrecord2idx {path} {path}.index"
    )


@pytest.mark.parametrize("name", ["TFRecordDataset", "ParquetDataset", "ArrowDataset"])
def test_no_files_at_all_are_refused(readers: dict, name: str) -> None:
    import stoker.formats

    with pytest.raises(ValueError) as info:
        getattr(stoker.formats, name)([])
    assert str(info.value) == "no files given: pass a path or a list of paths"


def test_damaged_tfrecord_is_named_with_its_record(readers: dict, tmp_path: Path) -> None:
    import shutil

    from stoker.formats import TFRecordDataset

    copies = []
    for source in readers["tfrecord"]().paths:  # damage copies: the fixture's files stay whole
        copies.append(str(tmp_path / Path(source).name))
        shutil.copy(source, copies[-1])
        shutil.copy(source + ".index", copies[-1] + ".index")
    dataset = TFRecordDataset(copies)
    path = dataset.paths[1]
    raw = bytearray(Path(path).read_bytes())
    offset, length = (int(x) for x in dataset.offsets[1][2])
    raw[offset + length - 6] ^= 0x55  # inside record 2's data
    Path(path).write_bytes(bytes(raw))
    with pytest.raises(ShardError) as info:
        dataset[14]
    assert str(info.value) == (
        f"{path}: record 2 (sample 14, bytes {offset}..{offset + length}) is damaged: the CRC "
        "of its data does not match; the file or its index changed: re-create them"
    )


@pytest.mark.parametrize(
    ("module", "extra", "what", "make"),
    [
        ("pyarrow.parquet", "parquet", "stoker.formats.ParquetDataset",
         lambda f: f.ParquetDataset("x.parquet")),
        ("pyarrow", "parquet", "stoker.formats.ArrowDataset", lambda f: f.ArrowDataset("x")),
        ("lmdb", "lmdb", "stoker.formats.LMDBDataset", lambda f: f.LMDBDataset("db")),
        ("tfrecord", "tfrecord", "stoker.formats.TFRecordDataset",
         lambda f: f.TFRecordDataset("x.tfrecord")),
        ("PIL.Image", "image", "ImageFolder(decode='pil')", lambda f: f.ImageFolder("images")),
    ],
)
def test_a_missing_library_says_which_extra_installs_it(
    monkeypatch: pytest.MonkeyPatch, module: str, extra: str, what: str, make: object
) -> None:
    from stoker import formats

    monkeypatch.setitem(sys.modules, module, None)  # its import fails, as if not installed
    with pytest.raises(ImportError) as info:
        make(formats)  # type: ignore[operator]
    assert str(info.value) == (
        f"{what} needs the {module!r} package, which is not installed. Install it with: "
        f"pip install 'stoker[{extra}]'"
    )


def test_a_parquet_column_the_files_lack_is_named(readers: dict, tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    from stoker.formats import ParquetDataset

    files = readers["parquet"]().paths
    assert ParquetDataset(files, columns=["index"])[3] == {"index": 3}
    with pytest.raises(ValueError, match=r"a\.parquet: no column 'indx'; its columns are "
                                         r"\['index', 'data'\]: fix columns="):
        ParquetDataset(files, columns=["index", "indx"])


def test_one_lmdb_database_under_two_spellings_opens_once(readers: dict, monkeypatch) -> None:
    pytest.importorskip("lmdb")
    from stoker.formats import LMDBDataset

    train = readers["lmdb"]()
    monkeypatch.chdir(Path(train.path).parent)  # "db/" here is the same database
    val = LMDBDataset("db/", transform=train.transform)
    assert all(torch.equal(val[i], train[i]) for i in range(3))
