"""The demo's JPEG workload as a doctor target (README: the doctor's report on it):

    stoker doctor stoker.doctor.demo_target:jpeg --report doctor.png

512 synthetic JPEGs (written once under the temporary directory, as ``stoker demo`` writes
them), PIL decode + random-resized-crop 224 + flip, ``batch_size=64``, ``shuffle=True``,
``num_workers=2``: the demo's own arguments. Needs the demo extra (Pillow).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

IMAGES = 512


def jpeg() -> tuple[Any, dict[str, Any]]:
    from stoker.doctor.demo_workload import JpegDataset, make_jpeg_files

    root = os.path.join(tempfile.gettempdir(), f"stoker-doctor-jpeg-{IMAGES}")
    dataset = JpegDataset(make_jpeg_files(root, IMAGES))
    return dataset, {"batch_size": 64, "shuffle": True, "num_workers": 2}
