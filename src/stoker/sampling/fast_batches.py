"""torch's ``BatchSampler`` over ``RandomSampler``/``SequentialSampler``, without per-index Python.

torch yields each index through two generators (``RandomSampler.__iter__`` then
``BatchSampler.__iter__``): ~0.5 µs per sample in the main process, which at a few hundred
thousand samples per second is the main process's largest cost. This produces the same
batches by slicing each ``randperm(...)`` chunk, and draws from the generator at the
same moments (lazily, chunk by chunk, including the final partial draw), so shuffles, base
seeds and later epochs are bit-identical to torch's. Used only for exactly these classes, with
torch's own methods (NOTE [ torch's own functions ]): a class a program patched is iterated as
the program has it.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.utils.data.sampler
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from stoker._core.torch_modes import modes_active, watched
from stoker._core.torch_own import c_method, methods_own, tensor_methods_own, torch_function_own
from stoker._core.torch_voice import TorchSite, at_torch_call

# ``len(self.data_source)`` is called from copies of torch's lines that call it, so a dataset's
# ``__len__`` that warns with ``stacklevel=2`` (or raises) names torch's line, as under torch
# (NOTE [ torch's fetchers call the dataset ] in fetch.fetchers).
_SAMPLER = "torch.utils.data.sampler"
_SEQUENTIAL_ITER = (TorchSite("SequentialSampler", "__iter__", "len", _SAMPLER), "self")
_RANDOM_LEN = (TorchSite("RandomSampler", "__iter__", "len", _SAMPLER), "self", "n")

# What torch's path reads of each class (``len(loader)`` reads ``__len__``; ``num_samples`` is a
# property) and what this module replaces.
_METHODS: dict[type, tuple[str, ...]] = {
    BatchSampler: ("__iter__", "__len__"),
    RandomSampler: ("__iter__", "__len__", "num_samples"),
    SequentialSampler: ("__iter__", "__len__"),
}


def _stock(cls: type) -> bool:
    return methods_own(cls, torch.utils.data.sampler, _METHODS[cls])


def _randperm_stock() -> bool:
    """torch's ``randperm(...).tolist()``, read here as ``.numpy()`` slices: the same ints
    only while both are torch's."""
    return torch_function_own("randperm") and tensor_methods_own(("tolist",))


Chunk = np.ndarray | list[int] | range


def _random_chunks(sampler: RandomSampler) -> Iterator[np.ndarray | list[int]]:
    at_torch = at_torch_call(*_RANDOM_LEN)  # n = len(self.data_source)
    n = len(sampler.data_source) if at_torch is None else at_torch(sampler)  # type: ignore[arg-type]
    generator = sampler.generator
    if generator is None:
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        generator = torch.Generator()
        generator.manual_seed(seed)
    for _ in range(sampler.num_samples // n):
        yield _ints(torch.randperm(n, generator=generator))
    yield _ints(torch.randperm(n, generator=generator))[: sampler.num_samples % n]


_numpy = c_method("numpy")  # torch's, whatever a program patched (NOTE [ torch's own functions ])


def _ints(perm: torch.Tensor) -> np.ndarray | list[int]:
    # An active torch mode or profiler sees torch's own call, tolist() (NOTE [ The program's
    # torch modes see torch's calls ]); else a view of the same ints, made lists a batch at a time
    return perm.tolist() if watched() else _numpy(perm)


def _sequential_chunks(sampler: SequentialSampler) -> Iterator[range]:
    at_torch = at_torch_call(*_SEQUENTIAL_ITER)  # return iter(range(len(self.data_source)))
    if at_torch is None:
        yield range(len(sampler.data_source))  # type: ignore[arg-type]
    else:  # a fresh range iterator's length hint is the range's length
        yield range(operator.length_hint(at_torch(sampler)))


def _as_list(part: np.ndarray | range | list[int]) -> list[int]:
    return part.tolist() if type(part) is np.ndarray else list(part)


def _batches(chunks: Iterator[Chunk], sampler: BatchSampler) -> Iterator[list[int]]:
    """torch's ``BatchSampler.__iter__`` over ``chunks``, each batch one slice of a chunk.

    Chunks stay arrays (or ranges) and only each batch becomes a list: a whole epoch as Python
    ints would be ~36 bytes per sample in the main process (72 MiB for 2M samples). Chunks are
    drawn at the same moments as torch's: the next one when an index past this one is asked
    for. ``drop_last`` and ``batch_size`` are read at the first ``next()``, as torch's
    generator reads them. With ``drop_last`` torch's ``zip(*[it] * batch_size)`` fixes the size
    for the epoch and drops a last short batch; without it, torch's loop reads ``batch_size``
    again for every batch, so a program that changes it mid-epoch gets batches of the new size
    from the next one on: once it changed, the rest is torch's own loop (``islice`` of the
    remaining indices), whatever size the program set."""
    drop_last, size = sampler.drop_last, sampler.batch_size
    if type(size) is not int or size <= 0:  # set so after the constructor checked it
        yield from BatchSampler.__iter__(sampler)  # torch's own loop reads it as it does
        return
    carry: list[int] = []
    for chunk in chunks:
        to_list: Any = np.ndarray.tolist if type(chunk) is np.ndarray else list
        pos, end = 0, len(chunk)
        while True:
            if not drop_last and sampler.batch_size != size:
                rest = itertools.chain(carry, _as_list(chunk[pos:]),
                                       itertools.chain.from_iterable(map(_as_list, chunks)))
                batch = [*itertools.islice(rest, sampler.batch_size)]
                while batch:
                    yield batch
                    batch = [*itertools.islice(rest, sampler.batch_size)]
                return
            if carry:  # a batch across two chunks
                take = min(size - len(carry), end - pos)
                carry.extend(_as_list(chunk[pos:pos + take]))
                pos += take
                if len(carry) < size:
                    break
                batch, carry = carry, []
                yield batch
            elif pos + size <= end:
                yield to_list(chunk[pos:pos + size])
                pos += size
            else:
                carry = _as_list(chunk[pos:])
                break
    if carry and not drop_last:
        yield carry


def draws_unseen_by_workers(index_sampler: Any) -> bool:
    """Drawing from ``index_sampler`` changes nothing a worker forked afterwards could read
    (NOTE [ Tasks before the next fork ]): torch's own ``BatchSampler`` over its own
    ``SequentialSampler`` (a range), or over its own ``RandomSampler`` without a generator
    (the seed it draws moves only the global torch RNG, which each worker seeds before any of
    the program's code runs), and no torch mode active (the worker's copy would have seen
    the draw). A program's sampler, or a generator the dataset may hold too, is not."""
    if type(index_sampler) is not BatchSampler or not _stock(BatchSampler) or modes_active():
        return False
    inner = index_sampler.sampler
    if type(inner) is SequentialSampler:
        return _stock(SequentialSampler)
    return (type(inner) is RandomSampler and inner.generator is None
            and _stock(RandomSampler) and _randperm_stock())


def fast_iter(index_sampler: Any) -> Iterator[list[int]] | None:
    """An equivalent fast iterator for torch's plain batch samplers, else None."""
    if type(index_sampler) is not BatchSampler or not _stock(BatchSampler):
        return None
    inner = index_sampler.sampler
    chunks: Iterator[Chunk]
    if (type(inner) is RandomSampler and not inner.replacement and _stock(RandomSampler)
            and _randperm_stock()):
        chunks = _random_chunks(inner)
    elif type(inner) is SequentialSampler and _stock(SequentialSampler):
        chunks = _sequential_chunks(inner)
    else:
        return None
    return _batches(chunks, index_sampler)
