"""obstore as the default S3 client (NOTE [ The client by default ] and [ The obstore client ]
in ``storage/obstore_files.py``): chosen only where it reads what s3fs would, and safe under
``fork`` whoever started its runtime: forked workers whose parent ran obstore's runtime (the
user's own use here, not stoker's) read with s3fs instead of hanging; workers forked from a
parent that never ran it read with obstore themselves. Each run is a fresh Python process
(what a training script is), against the real S3 server of ``test_remote_storage``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _s3_server import SERVER_NEEDS

from _optional import skip_module_unless

skip_module_unless(
    *SERVER_NEEDS,
    ("s3fs", "obstore's fallback in forked workers (test extra)"),
    ("obstore", "the default client when installed (test extra)"),
)

from _remote_datasets import records_on_server  # noqa: E402

from stoker.storage.obstore_files import auto_client  # noqa: E402

HERE = Path(__file__).resolve().parent
SHARDS, PER_SHARD = 3, 8

_SCRIPT = r"""
import gc, json, sys, time
import torch
started = sys.argv[1] == "user_started_obstore"
if started:  # the user's own obstore use, before stoker is imported: its runtime runs here
    import obstore
    from obstore.store import MemoryStore
    obstore.put(MemoryStore(), "k", b"x")
import psutil
import stoker
from _remote_datasets import FAST_RETRY, Records
from stoker.storage import open_source
from stoker.storage.obstore_files import ObstoreFiles

endpoint, urls = sys.argv[2], sys.argv[3:]

class RecordsAndClient(Records):
    def __getitem__(self, i):
        sample = super().__getitem__(i)  # opens this process's client first
        kind = "obstore" if isinstance(self.source._handle.fs, ObstoreFiles) else "fsspec"
        return sample, kind

source = open_source(urls[0], storage_options={"client_kwargs": {"endpoint_url": endpoint}},
                     retry=FAST_RETRY, fetch="range")
loader = stoker.DataLoader(RecordsAndClient(source, urls, %(per_shard)d), batch_size=4,
                           num_workers=2, timeout=60, multiprocessing_context="fork")
ids, kinds = [], set()
for batch, batch_kinds in loader:
    ids += batch[:, 0].tolist()
    kinds |= set(batch_kinds)
del loader
gc.collect()
deadline = time.monotonic() + 30
while psutil.Process().children() and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"client": source.client, "ids": sorted(ids), "kinds": sorted(kinds),
                  "left": len(psutil.Process().children())}))
"""


def _clean_env() -> dict[str, str]:
    """This environment without AWS settings or proxies, with the test server's credentials
    in the variables both clients read."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AWS_") and k.upper() not in ("HTTP_PROXY", "HTTPS_PROXY",
                                                             "ALL_PROXY", "NO_PROXY")}
    env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_DEFAULT_REGION="us-east-1",
               PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]))
    return env


@pytest.mark.parametrize("parent", ["user_started_obstore", "nothing_started"])
def test_forked_workers_read_with_obstore_unless_their_parent_ran_its_runtime(
        tmp_path, parent) -> None:
    with records_on_server(tmp_path, SHARDS, PER_SHARD) as s3:
        done = subprocess.run(
            [sys.executable, "-c", _SCRIPT % {"per_shard": PER_SHARD}, parent,
             s3.endpoint_url, *s3.urls],
            capture_output=True, text=True, timeout=180, env=_clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["client"] == "obstore"  # what auto chose in the main process
    assert got["ids"] == list(range(SHARDS * PER_SHARD))
    assert got["kinds"] == (["fsspec"] if parent == "user_started_obstore" else ["obstore"])
    assert got["left"] == 0


ENDPOINT = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}
KEYS = {"key": "k", "secret": "s"}


@pytest.fixture
def bare_env(monkeypatch, tmp_path):
    """No AWS variable, no proxy, a home without ~/.aws."""
    for name in list(os.environ):
        if name.startswith("AWS_") or name.upper() in ("HTTP_PROXY", "HTTPS_PROXY",
                                                       "ALL_PROXY", "NO_PROXY"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    return monkeypatch


@pytest.mark.parametrize(("protocol", "options", "env", "want"), [
    ("s3", KEYS | ENDPOINT, {}, "obstore"),
    ("s3", {"anon": True} | ENDPOINT, {}, "obstore"),
    ("s3", ENDPOINT, {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}, "obstore"),
    ("s3", KEYS, {"AWS_DEFAULT_REGION": "eu-west-1"}, "obstore"),
    ("s3", KEYS | {"client_kwargs": {"region_name": "eu-west-1"}}, {}, "obstore"),
    ("gs", KEYS, {}, "fsspec"),  # obstore here reads s3:// only
    ("s3", ENDPOINT, {}, "fsspec"),  # credentials from botocore's chain (files, SSO, ...)
    ("s3", KEYS | ENDPOINT, {"AWS_PROFILE": "work"}, "fsspec"),
    ("s3", KEYS | ENDPOINT, {"AWS_ENDPOINT_URL": "http://elsewhere"}, "fsspec"),
    ("s3", KEYS | ENDPOINT, {"HTTPS_PROXY": "http://proxy:3128"}, "fsspec"),
    ("s3", KEYS | ENDPOINT, {"AWS_SESSION_TOKEN": "t"}, "fsspec"),  # botocore drops it
    ("s3", KEYS | {"token": "t"} | ENDPOINT, {"AWS_SESSION_TOKEN": "t2"}, "obstore"),
    ("s3", KEYS, {}, "fsspec"),  # no region: botocore follows the bucket's redirect
    ("s3", KEYS, {"AWS_DEFAULT_REGION": "eu-west-1", "AWS_REGION": "us-east-2"}, "fsspec"),
    ("s3", KEYS | ENDPOINT | {"requester_pays": True}, {}, "fsspec"),  # s3fs's alone
    ("s3", KEYS | ENDPOINT, {"AWS_CA_BUNDLE": "/etc/ssl/certs/ca.crt"}, "obstore"),  # http://
    ("s3", KEYS | {"client_kwargs": {"endpoint_url": "https://s3.example"}},
     {"AWS_CA_BUNDLE": "/etc/ssl/certs/ca.crt"}, "fsspec"),  # TLS: botocore's bundle
])
def test_auto_picks_obstore_only_where_it_reads_what_s3fs_would(
        bare_env, protocol, options, env, want) -> None:
    for name, value in env.items():
        bare_env.setenv(name, value)
    assert auto_client(protocol, options) == want


def test_auto_leaves_the_region_to_botocore_when_aws_config_may_set_it(bare_env,
                                                                       tmp_path) -> None:
    assert auto_client("s3", KEYS | ENDPOINT) == "obstore"
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "config").write_text("[default]\nregion = eu-west-1\n")
    assert auto_client("s3", KEYS | ENDPOINT) == "fsspec"
