"""NOTE [ Import only what the loader needs ] in ``stoker._core.lazy_exports``: ``import stoker``
loads no torch, ``stoker.DataLoader`` after ``import torch`` loads the loader and what building
one needs, nothing else; every public name is still there when read. Structure, not timing
(``benchmarks/import_time.py`` times it).

Each check runs in a fresh interpreter (what is imported depends on what ran before), started
and waited for here; nothing outlives the test."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import stoker

# Loaded on first use, never by ``import stoker`` nor by reading ``stoker.DataLoader``.
NOT_AT_IMPORT = [
    "stoker.formats", "stoker.image", "stoker.storage", "stoker.doctor", "stoker.integrations",
    "stoker.cli", "stoker.device", "stoker.workers", "stoker.collate", "stoker.mix",
    "stoker.testing", "stoker.stateful", "stoker.vision", "stoker.engine.process_iter",
    "stoker.engine.thread_iter", "stoker.engine.inline_iter", "stoker.engine.worker_group",
    "stoker.engine.worker_streams", "stoker.transport.slab_writer", "stoker.transport.segments",
    "stoker.fastpaths.index_tensor", "stoker.sharing.shared_list", "stoker.profile.memory_watch",
    "numpy.random", "fsspec", "PIL", "cv2", "simplejpeg", "zlib_ng", "pyarrow", "lmdb",
    "torchvision", "matplotlib", "psutil", "obstore", "s3fs", "botocore", "aiohttp", "tfrecord",
]


def _fresh(code: str) -> dict:
    """Run ``code`` (which sets ``out``) after ``import torch`` in a new interpreter."""
    script = "import json, sys\nimport torch\n" + textwrap.dedent(code) + "\nprint(json.dumps(out))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_import_stoker_loads_none_of_what_waits_for_first_use() -> None:
    out = _fresh("""
        before = set(sys.modules)
        import stoker
        at_import = sorted(set(sys.modules) - before)
        stoker.DataLoader
        out = [at_import, sorted(set(sys.modules) - before)]
    """)
    at_import, with_loader = out
    assert [m for m in at_import if m.startswith("stoker")] == [
        "stoker", "stoker._core", "stoker._core.import_watch", "stoker._core.lazy_exports",
        "stoker.errors"]
    loaded = [m for m in with_loader
              if any(m == p or m.startswith(p + ".") for p in NOT_AT_IMPORT)]
    assert loaded == []
    assert "stoker.loader" in with_loader


def test_import_stoker_imports_no_torch() -> None:
    """What the ``stoker`` command relies on to parse its arguments without torch."""
    code = "import sys, stoker; print(sorted(m for m in sys.modules if m.startswith('torch')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "[]\n", "")


def test_every_public_name_is_there_when_read() -> None:
    out = _fresh("""
        import stoker
        listed = set(dir(stoker))
        out = {name: type(getattr(stoker, name)).__name__ for name in stoker.__all__}
        out["<not in dir>"] = sorted(set(stoker.__all__) - listed)
        namespace = {}
        exec("from stoker import *", namespace)
        out["<star>"] = sorted(set(namespace) - {"__builtins__"}) == sorted(stoker.__all__)
    """)
    assert out.pop("<not in dir>") == []
    assert out.pop("<star>") is True
    assert sorted(out) == sorted(stoker.__all__)
    assert all(kind != "NoneType" for kind in out.values()), out


def test_a_subpackage_loads_only_the_module_of_the_name_read() -> None:
    out = _fresh("""
        from stoker.formats import TarShards
        import stoker.storage
        out = {"loaded": sorted(m for m in sys.modules if m.startswith("stoker.")),
               "dir": sorted(set(stoker.storage.__all__) - set(dir(stoker.storage)))}
    """)
    assert "stoker.formats.tar_shards" in out["loaded"]
    assert not {"stoker.formats.pack", "stoker.formats.columnar", "stoker.image.decode"} & set(
        out["loaded"])
    assert out["dir"] == []


def test_formats_pack_is_the_function_whichever_is_imported_first() -> None:
    # Importing the module stoker.formats.pack binds the module on its package; the package
    # keeps the function there (formats/__init__.py).
    out = _fresh("""
        import stoker.formats.pack
        import stoker.formats
        first = type(stoker.formats.pack).__name__
        from stoker.formats import pack
        out = [first, type(pack).__name__, pack is stoker.formats.pack]
    """)
    assert out == ["function", "function", True]


def test_accelerate_is_watched_without_loading_the_integration() -> None:
    # obstore too: NOTE [ The obstore client ] (the fork hook loads when obstore does)
    out = _fresh("""
        import stoker
        ours = [f for f in sys.meta_path if type(f).__module__.startswith("stoker")]
        out = [len(ours)] + sorted(ours[0].hooks)  # one finder for every watch
        out.append(any(m.startswith("stoker.integrations") for m in sys.modules))
        out.append("stoker.storage.obstore_files" in sys.modules)
    """)
    assert out == [
        1, "accelerate.checkpointing", "accelerate.data_loader",
        "lightning.pytorch.trainer.connectors.checkpoint_connector", "obstore",
        "pytorch_lightning.trainer.connectors.checkpoint_connector", False, False,
    ]  # NOTE [ Every rank's part ]: Accelerate's and Lightning's checkpoint code too


def test_importing_obstore_after_stoker_registers_the_fork_hook() -> None:
    """NOTE [ The obstore client ]: whoever imports obstore, the hook that tells forked
    workers whether its runtime ran in their parent is registered before any fork."""
    pytest.importorskip("obstore", reason="obstore is an optional extra")
    out = _fresh("""
        import stoker
        import obstore
        out = ["stoker.storage.obstore_files" in sys.modules]
    """)
    assert out == [True]


def test_a_watched_module_found_but_not_imported_still_runs_its_hook_when_imported() -> None:
    """``importlib.util.find_spec(name)`` (a check that a package is installed) finds a spec
    that no import runs: the watch keeps its hooks until the module's body does run."""
    out = _fresh("""
        import importlib.util
        from stoker._core.import_watch import when_imported
        ran = []
        def seen(module):
            ran.append(module)
        when_imported("json.tool", "__main__:seen")
        out = [importlib.util.find_spec("json.tool") is not None]
        import json.tool
        out += [len(ran), ran[0].__name__ if ran else None]
    """)
    assert out == [True, 1, "json.tool"]
