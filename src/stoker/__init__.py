"""stoker: keeps the accelerator fed. A drop-in, faster, safer torch DataLoader."""

from stoker import formats, image, sharing, storage
from stoker.collate import default_collate, default_convert
from stoker.distributed import EndOfData
from stoker.errors import (
    BatchDeviceError,
    CopyOnReadWarning,
    CudaInWorkersError,
    DeviceUnavailableError,
    LoaderTimeoutError,
    MixedDeviceError,
    PackError,
    PackInterrupted,
    RemoteReadError,
    RemoteTraceback,
    ShardError,
    SkipBudgetExceeded,
    StallWarning,
    StokerError,
    WorkerDiedError,
    WorkerError,
)
from stoker.loader import DataLoader
from stoker.mix import Mix
from stoker.sampling.sample_rng import sample_generator, sample_rng, sample_seed
from stoker.stateful import StatefulDataLoader
from stoker.workers.worker_info import get_worker_info

__all__ = [
    "BatchDeviceError",
    "CopyOnReadWarning",
    "CudaInWorkersError",
    "DataLoader",
    "DeviceUnavailableError",
    "EndOfData",
    "LoaderTimeoutError",
    "Mix",
    "MixedDeviceError",
    "PackError",
    "PackInterrupted",
    "RemoteReadError",
    "RemoteTraceback",
    "ShardError",
    "SkipBudgetExceeded",
    "StallWarning",
    "StatefulDataLoader",
    "StokerError",
    "WorkerDiedError",
    "WorkerError",
    "default_collate",
    "default_convert",
    "formats",
    "get_worker_info",
    "image",
    "sample_generator",
    "sample_rng",
    "sample_seed",
    "sharing",
    "storage",
]

__version__ = "0.1.0"

from stoker.integrations import accelerate as _accelerate  # noqa: E402

_accelerate.register()  # NOTE [ Accelerate keeps stoker ]
