"""Headless Chromium (Debian's ``chromium``) for the docs and report tests: a page opened
with a probe script appended, what the probe reports read back from ``--dump-dom``.

Each call runs the browser in its own process group with a timeout and kills the group
afterwards, so none of its helper processes outlives the call."""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MISSING = ("needs Debian's chromium package (apt-get install chromium; scripts/test.sh installs "
           "it where it runs as root)")
_RESULT = re.compile(r'<pre id="probe"[^>]*>(.*?)</pre>', re.S)


def chromium(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    assert CHROMIUM is not None
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--disable-crash-reporter", "--disable-breakpad", "--hide-scrollbars",
            "--no-first-run", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        raise AssertionError(f"chromium did not finish in {timeout_s} s: {argv}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a helper that outlived the browser
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def probe(page: Path, script: str, profile: Path, width: int = 1280, height: int = 900
          ) -> dict[str, Any]:
    """Open a copy of ``page`` (beside it, so its relative links hold) with ``script`` before
    ``</body>`` in a ``width`` x ``height`` window; the script writes its JSON result into
    ``<pre id="probe">``."""
    probed = page.with_name(f"_probed_{page.name}")
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", script + "</body>"),
                      encoding="utf-8")
    try:
        dom = chromium(f"--user-data-dir={profile}", f"--window-size={width},{height}",
                       "--virtual-time-budget=5000", "--dump-dom", probed.as_uri())
    finally:
        probed.unlink()
    found = _RESULT.search(dom.stdout)
    assert found, f"{page.name}: no probe result; chromium said:\n{dom.stderr[-3000:]}"
    return json.loads(html.unescape(found.group(1)))
