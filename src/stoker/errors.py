"""stoker's exceptions. Each subclasses the builtin a user already catches.

    Exception
     ├── RuntimeError
     │    └── StokerError
     │         ├── WorkerError          a worker failed and the original error could not travel
     │         ├── WorkerDiedError      a worker process exited or was killed mid-epoch
     │         ├── LoaderTimeoutError   no batch within ``timeout`` seconds (torch's message)
     │         └── SkipBudgetExceeded   on_error="skip" skipped more samples than allowed
     └── RemoteTraceback                the worker-side traceback, chained as ``__cause__``
"""

from __future__ import annotations


class StokerError(RuntimeError):
    """Base class of every error stoker raises itself."""


class WorkerError(StokerError):
    """An error in a worker whose original exception could not be rebuilt in the main process."""


class WorkerDiedError(StokerError):
    """A worker process exited or was killed while the loader still needed it."""


class LoaderTimeoutError(StokerError):
    """No batch arrived within the loader's ``timeout``."""


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback; chained as ``__cause__`` of the re-raised error."""

    def __init__(self, tb_text: str) -> None:
        super().__init__(tb_text)
        self.tb_text = tb_text

    def __str__(self) -> str:
        return self.tb_text


class SkipBudgetExceeded(StokerError):
    """``on_error="skip"`` skipped more samples in an epoch than ``skip_budget`` allows."""
