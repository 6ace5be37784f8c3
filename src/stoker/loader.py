"""``stoker.DataLoader``: torch's DataLoader interface on stoker's engine.

It *is* a ``torch.utils.data.DataLoader`` (a subclass): the constructor, its validation and
error messages, ``len()``, frozen attributes and the generic alias are torch's own, so code that
checks ``isinstance(loader, torch.utils.data.DataLoader)`` (Lightning, Accelerate) keeps working.
Iteration is stoker's (``_runtime``), and so are ``state_dict``/``load_state_dict``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar

import torch.utils.data

from stoker._runtime.base_iter import BaseIterator
from stoker._runtime.inline_iter import InlineIterator
from stoker._runtime.process_iter import ProcessIterator
from stoker._runtime.progress import check_state
from stoker.sampling.rng_state import RngSnapshot

T_co = TypeVar("T_co", covariant=True)
Seeding = Literal["per_batch", "per_worker"]
_SEEDINGS = ("per_batch", "per_worker")


class DataLoader(torch.utils.data.DataLoader[T_co]):
    """Drop-in replacement for :class:`torch.utils.data.DataLoader`; same arguments, same batches.

    Extra keyword-only arguments (all optional):

    seeding: ``"per_batch"`` (default) reseeds ``random``, numpy's global RNG and torch's
        default generator before every batch from (base seed, epoch, batch position), in
        whichever process fetches it, so random augmentations do not depend on ``num_workers``
        and resume exactly. With ``num_workers=0`` the caller's RNG states are restored after
        each fetch. ``"per_worker"`` is torch's behaviour: each worker is seeded once at start.
    stall_warning_s: with workers, if no batch arrives for this long, warn once (per stall)
        naming the busy workers, the samples they hold and their current Python stacks, and
        keep waiting. ``None`` turns it off. ``timeout`` still fails hard, with the same report.
    """

    def __init__(
        self,
        dataset: torch.utils.data.Dataset[T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: torch.utils.data.Sampler | Iterable | None = None,
        batch_sampler: torch.utils.data.Sampler[list] | Iterable[list] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[T_co]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        seeding: Seeding = "per_batch",
        stall_warning_s: float | None = 300.0,
    ) -> None:
        if seeding not in _SEEDINGS:
            raise ValueError(f"seeding={seeding!r}: expected one of {_SEEDINGS}.")
        if stall_warning_s is not None and not stall_warning_s > 0:
            raise ValueError(
                f"stall_warning_s={stall_warning_s!r}: expected a positive number of seconds, "
                "or None to never warn."
            )
        self.seeding = seeding
        self.stall_warning_s = stall_warning_s
        self._stoker_iterations = 0  # epochs begun (drives DistributedSampler.set_epoch)
        self._stoker_progress: Any = None
        self._stoker_resume: dict[str, Any] | None = None
        self._stoker_epoch_set: int | None = None
        super().__init__(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
            pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order,
        )

    # -- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> BaseIterator:  # type: ignore[override]
        resume, self._stoker_resume = self._stoker_resume, None
        self._auto_set_epoch()
        if self.persistent_workers and self.num_workers > 0:
            it = self._iterator
            if it is None or it.stopped or resume is not None:  # type: ignore[attr-defined]
                if it is not None:
                    it._shutdown()  # type: ignore[attr-defined]
                self._iterator = self._make_iterator(resume)
            else:
                it._reset(self)
            result = self._iterator
        else:
            result = self._make_iterator(resume)
        self._stoker_iterations += 1
        return result  # type: ignore[return-value]

    def _get_iterator(self) -> Any:
        return self._make_iterator(None)

    def _make_iterator(self, resume: dict[str, Any] | None) -> Any:
        if self.num_workers == 0:
            return InlineIterator(self, resume)
        self.check_worker_number_rationality()
        return ProcessIterator(self, resume)

    def _auto_set_epoch(self) -> None:
        """Call ``sampler.set_epoch`` each epoch, unless the user already set it themselves.

        Forgetting ``DistributedSampler.set_epoch`` silently repeats one shuffle every epoch.
        stoker sets it to the number of epochs begun, and stands back as soon as it sees a value
        it did not set (the user's own schedule wins).
        """
        sampler = self.sampler
        if not callable(getattr(sampler, "set_epoch", None)):
            return
        current = getattr(sampler, "epoch", None)
        if self._stoker_epoch_set is None and current not in (None, 0):
            return  # the user set an epoch before the first iteration
        if self._stoker_epoch_set is not None and current != self._stoker_epoch_set:
            return  # the user sets epochs themselves
        sampler.set_epoch(self._stoker_iterations)  # type: ignore[union-attr,attr-defined]
        self._stoker_epoch_set = self._stoker_iterations

    # -- resume ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The state after the last batch this loader handed out (torchdata's semantics).

        Plain values only (ints, strings, lists): it round-trips through ``torch.save`` and JSON.
        Before the first batch it is the initial state; after a finished epoch it is the start
        of the next one. ``load_state_dict`` applies it to the next ``iter()``.
        """
        progress = self._stoker_progress
        if self._stoker_resume is not None:
            return dict(self._stoker_resume)
        if progress is None or progress.finished:
            state = self._fresh_state(progress)
        else:
            state = progress.state_dict()
        if callable(getattr(self.dataset, "state_dict", None)):
            state["dataset_state"] = self.dataset.state_dict()  # type: ignore[attr-defined]
        return state

    def _fresh_state(self, finished: Any) -> dict[str, Any]:
        """The state of an epoch not begun yet: generators as they are now."""
        rng = RngSnapshot(self.generator, self._index_sampler)
        rng.capture()
        persistent_alive = (
            finished is not None and self._iterator is not None
            and not self._iterator.stopped  # type: ignore[attr-defined]
        )
        return {
            "format": "stoker.DataLoader/1",
            "iterations": self._stoker_iterations,
            "epoch": finished.epoch + 1 if persistent_alive else 0,
            "batches": 0,
            "extra_batches": [],
            "finished": False,
            "base_seed": finished.base_seed if persistent_alive else 0,
            "drew_base_seed": not persistent_alive,
            "rng": rng.encoded(),
            "sampler_state": None,
            "sampler_epoch": getattr(self.sampler, "epoch", None),
            "dataset_kind": "iterable" if self._dataset_kind else "map",
            "num_workers": self.num_workers,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict`` at the next ``iter()``; works across ``num_workers``."""
        state = check_state(state_dict)
        if "dataset_state" in state and callable(getattr(self.dataset, "load_state_dict", None)):
            self.dataset.load_state_dict(state["dataset_state"])  # type: ignore[attr-defined]
        self._stoker_iterations = state["iterations"]
        epoch = state.get("sampler_epoch")
        if epoch is not None and callable(getattr(self.sampler, "set_epoch", None)):
            self.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            # The autopilot resumes only if it was driving (it sets epoch == iterations).
            self._stoker_epoch_set = epoch if epoch == state["iterations"] else -1
        self._stoker_resume = state
        self._stoker_progress = None
