"""torch's ``BatchSampler`` over ``RandomSampler``/``SequentialSampler``, without per-index Python.

torch yields each index through two generators (``RandomSampler.__iter__`` then
``BatchSampler.__iter__``): ~0.5 µs per sample in the main process, which at a few hundred
thousand samples per second is the main process's largest cost. This produces the same
batches by slicing each ``randperm(...).tolist()`` chunk, and draws from the generator at the
same moments (lazily, chunk by chunk, including the final partial draw), so shuffles, base
seeds and later epochs are bit-identical to torch's. Used only for exactly these classes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler


def _random_chunks(sampler: RandomSampler) -> Iterator[list[int]]:
    n = len(sampler.data_source)  # type: ignore[arg-type]
    generator = sampler.generator
    if generator is None:
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        generator = torch.Generator()
        generator.manual_seed(seed)
    for _ in range(sampler.num_samples // n):
        yield torch.randperm(n, generator=generator).tolist()
    yield torch.randperm(n, generator=generator).tolist()[: sampler.num_samples % n]


def _sequential_chunks(sampler: SequentialSampler) -> Iterator[list[int]]:
    yield list(range(len(sampler.data_source)))  # type: ignore[arg-type]


def _batches(chunks: Iterator[list[int]], size: int, drop_last: bool) -> Iterator[list[int]]:
    carry: list[int] = []
    for chunk in chunks:
        if carry:
            need = size - len(carry)
            carry.extend(chunk[:need])
            chunk = chunk[need:]
            if len(carry) < size:
                continue
            yield carry
            carry = []
        full = len(chunk) - len(chunk) % size
        for start in range(0, full, size):
            yield chunk[start : start + size]
        carry = chunk[full:]
    if carry and not drop_last:
        yield carry


def fast_iter(index_sampler: Any) -> Iterator[list[int]] | None:
    """An equivalent fast iterator for torch's plain batch samplers, else None."""
    if type(index_sampler) is not BatchSampler:
        return None
    inner = index_sampler.sampler
    if type(inner) is RandomSampler and not inner.replacement:
        chunks = _random_chunks(inner)
    elif type(inner) is SequentialSampler:
        chunks = _sequential_chunks(inner)
    else:
        return None
    return _batches(chunks, index_sampler.batch_size, index_sampler.drop_last)
