"""The constructor arguments that rebuild a loader (torch's or stoker's), read back from its
attributes: how the doctor keeps the user's loader as a recipe (``target.py``) and what the
agent inside a script reports (``agent.py``). Reads a loader; imports none."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

# stoker's own keyword arguments, read back from a stoker loader's attributes.
_STOKER_ATTRS = ("worker_type", "worker_concurrency", "beyond_torch", "seeding", "on_error",
                 "skip_budget", "device", "device_prefetch", "device_transform")


def kwargs_of(loader: DataLoader[Any]) -> dict[str, Any]:
    """The constructor arguments that rebuild ``loader`` (its sampler objects reused)."""
    from torch.utils.data._utils.collate import default_collate, default_convert

    kwargs: dict[str, Any] = {}
    if loader.batch_size is not None:
        kwargs.update(batch_size=loader.batch_size, **_order(loader),
                      drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        kwargs.update(batch_sampler=loader.batch_sampler)
    else:
        kwargs.update(batch_size=None, **_order(loader))
    if loader.collate_fn not in (default_collate, default_convert) and not _stokers(
        loader.collate_fn
    ):
        kwargs["collate_fn"] = loader.collate_fn
    kwargs["num_workers"] = loader.num_workers
    for name in ("pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
                 "generator", "persistent_workers", "in_order"):
        kwargs[name] = getattr(loader, name)
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    for name in _STOKER_ATTRS:
        if hasattr(loader, name):
            kwargs[name] = getattr(loader, name)
    if kwargs.get("device") is None:  # no device feed: leave its arguments out
        for name in ("device", "device_prefetch", "device_transform"):
            kwargs.pop(name, None)
    return kwargs


def _order(loader: DataLoader[Any]) -> dict[str, Any]:
    """``shuffle=True`` for the sampler ``shuffle=True`` made, nothing for the default one
    (what the user wrote, and what rebuilds the same order); else the sampler object."""
    from torch.utils.data import RandomSampler, SequentialSampler
    from torch.utils.data.dataloader import _InfiniteConstantSampler

    sampler = loader.sampler
    if type(sampler) is _InfiniteConstantSampler or (
            type(sampler) is SequentialSampler and sampler.data_source is loader.dataset):
        return {}
    if (type(sampler) is RandomSampler and sampler.data_source is loader.dataset
            and not sampler.replacement and sampler.num_samples == len(sampler.data_source)
            and sampler.generator is loader.generator):
        return {"shuffle": True}
    return {"sampler": sampler}


def _stokers(fn: Any) -> bool:
    return getattr(fn, "__module__", "").startswith("stoker.collate")
