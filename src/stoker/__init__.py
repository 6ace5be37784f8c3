"""stoker: keeps the accelerator fed. A drop-in, faster, safer torch DataLoader."""

import typing as _typing

from stoker._core.import_watch import when_imported as _when_imported
from stoker._core.lazy_exports import lazy_exports as _lazy_exports
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

# NOTE [ Import only what the loader needs ]: loaded when first read (torch too: `stoker --help`).
_LAZY = {
    "DataLoader": "stoker.loader",
    "EndOfData": "stoker.distributed",
    "Mix": "stoker.mix",
    "Plan": "stoker._core.plan",
    "StatefulDataLoader": "stoker.stateful",
    "StatsHook": "stoker._core.stats",
    "SupportsEpoch": "stoker._core.dataset_hooks",
    "SupportsFetchForBatch": "stoker._core.dataset_hooks",
    "SupportsFetchForStream": "stoker._core.dataset_hooks",
    "SupportsPrepareBatch": "stoker._core.dataset_hooks",
    "SupportsShareLists": "stoker._core.dataset_hooks",
    "SupportsTensorIndex": "stoker._core.dataset_hooks",
    "SupportsThreadSafe": "stoker._core.dataset_hooks",
    "default_collate": "stoker.collate",
    "default_convert": "stoker.collate",
    "get_worker_info": "stoker.workers.worker_info",
    "sample_generator": "stoker.sampling.sample_rng",
    "sample_rng": "stoker.sampling.sample_rng",
    "sample_seed": "stoker.sampling.sample_rng",
    "formats": "",
    "image": "",
    "sharing": "",
    "storage": "",
}
__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)

if _typing.TYPE_CHECKING:
    from stoker import formats, image, sharing, storage
    from stoker._core.dataset_hooks import (
        SupportsEpoch,
        SupportsFetchForBatch,
        SupportsFetchForStream,
        SupportsPrepareBatch,
        SupportsShareLists,
        SupportsTensorIndex,
        SupportsThreadSafe,
    )
    from stoker._core.plan import Plan
    from stoker._core.stats import StatsHook
    from stoker.collate import default_collate, default_convert
    from stoker.distributed import EndOfData
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
    "Plan",
    "RemoteReadError",
    "RemoteTraceback",
    "ShardError",
    "SkipBudgetExceeded",
    "StallWarning",
    "StatefulDataLoader",
    "StatsHook",
    "StokerError",
    "SupportsEpoch",
    "SupportsFetchForBatch",
    "SupportsFetchForStream",
    "SupportsPrepareBatch",
    "SupportsShareLists",
    "SupportsTensorIndex",
    "SupportsThreadSafe",
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

# NOTE [ Accelerate keeps stoker ]: the integration loads only if Accelerate does.
_when_imported("accelerate.data_loader", "stoker.integrations.accelerate:install")
# NOTE [ Every rank's part ]: frameworks that save one loader state for all ranks.
_when_imported("accelerate.checkpointing", "stoker.integrations.accelerate_state:install")
for _connector in ("lightning.pytorch.trainer.connectors.checkpoint_connector",
                   "pytorch_lightning.trainer.connectors.checkpoint_connector"):
    _when_imported(_connector, "stoker.integrations.lightning:install")
# NOTE [ The obstore client ]: whoever imports obstore, stoker's forked workers must know whether
# its runtime ran in the process they were forked from (the fork hook of obstore_files).
_when_imported("obstore", "stoker.storage.obstore_files:watch_forks")
