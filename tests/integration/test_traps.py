"""Classic DataLoader traps: accelerator data in workers, mixed devices, dataset-owned RNGs."""

from __future__ import annotations

import logging
import multiprocessing
import warnings

import numpy as np
import pytest
import torch

import stoker
from stoker.engine.cuda_safety import CudaInWorkersError, refuse_device_tensors, safe_context

FIX = (
    "Keep every sample on one device: return CPU tensors from __getitem__ (move GPU-made data "
    "such as pseudo-labels to the CPU with .cpu() before it goes into the dataset) and move "
    "whole batches to the GPU in the training loop with batch.to(device, non_blocking=True)."
)


def _images_and_pseudo_labels():
    # The seed note's case: CPU images concatenated with labels made on the GPU ('meta' here).
    images = torch.utils.data.TensorDataset(torch.randn(4, 3))
    pseudo = torch.utils.data.TensorDataset(torch.randn(4, 3, device="meta"))
    return torch.utils.data.ConcatDataset([images, pseudo])


@pytest.mark.parametrize("executor", [{"num_workers": 0}, {"num_workers": 2},
                                      {"worker_type": "thread"}])
def test_mixed_devices_name_the_devices_and_samples(executor):
    loader = stoker.DataLoader(_images_and_pseudo_labels(), batch_size=4, shuffle=False,
                               sampler=[2, 3, 4, 5], **executor)
    with pytest.raises(stoker.MixedDeviceError) as info:
        list(loader)
    assert str(info.value) == (
        "Cannot collate a batch whose tensors are on different devices: samples [2, 3] are on "
        f"cpu, samples [4, 5] are on meta. {FIX}"
    )
    assert isinstance(info.value, RuntimeError)  # what torch users already catch


def test_dataset_holding_accelerator_tensors_is_refused_before_workers_start():
    dataset = _images_and_pseudo_labels()
    with pytest.raises(CudaInWorkersError) as info:
        refuse_device_tensors(dataset, 2, device_types=frozenset({"meta"}))
    assert str(info.value) == (
        "DataLoader(num_workers=2) cannot hand dataset.datasets[1].tensors[0] to worker "
        "processes: it is a tensor on meta, and workers cannot use CUDA (they fail with 'CUDA "
        "error: initialization error'). Keep dataset tensors on the CPU "
        "(dataset.datasets[1].tensors[0] = dataset.datasets[1].tensors[0].cpu()) and move each "
        "batch to the GPU in the training loop with batch.to(device, non_blocking=True) "
        "(pin_memory=True makes that copy asynchronous); or use num_workers=0."
    )
    refuse_device_tensors(torch.utils.data.TensorDataset(torch.ones(2)), 2)  # CPU: fine


class _Picklable(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i


class _Unpicklable(_Picklable):
    def __init__(self):
        self.transform = lambda x: x


def test_cuda_initialised_parent_switches_fork_to_forkserver(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    fork = multiprocessing.get_context("fork")
    loader = stoker.DataLoader(_Picklable(), num_workers=2)
    # Said on stoker's logger, not through warnings (issue 44): the run goes on and succeeds.
    with caplog.at_level(logging.WARNING, "stoker.engine.cuda_safety"), \
            warnings.catch_warnings():
        warnings.simplefilter("error")
        ctx = safe_context(None, fork, loader)
    assert ctx.get_start_method() == "forkserver"
    assert [(r.name, r.getMessage()) for r in caplog.records] == [(
        "stoker.engine.cuda_safety",
        "stoker: CUDA is already initialised in this process and forked workers cannot use it; "
        "starting them with 'forkserver' instead (the dataset is pickled to each worker). Pass "
        "multiprocessing_context='forkserver' (or 'spawn') to choose this explicitly."
    )]
    explicit = multiprocessing.get_context("fork")
    assert safe_context(explicit, fork, loader) is explicit  # the user's choice stands


def test_cuda_initialised_parent_with_unpicklable_dataset_says_why(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    loader = stoker.DataLoader(_Unpicklable(), num_workers=2)
    with pytest.raises(CudaInWorkersError) as info:
        safe_context(None, multiprocessing.get_context("fork"), loader)
    text = str(info.value)
    assert text.startswith(
        "CUDA is already initialised in this process, so workers cannot be forked and stoker "
        "must start them with 'forkserver', which pickles what they need; but the dataset does "
        "not pickle ("
    )
    assert text.endswith(
        "). Define the dataset class and functions at module level (no lambdas, open files or "
        "locks), or create and iterate the DataLoader before CUDA is first used, or use "
        "num_workers=0."
    )


class _OwnsGenerators(torch.utils.data.Dataset):
    """Generators made in __init__: identical copies in every worker under torch."""

    def __init__(self):
        self.rng = np.random.default_rng(0)
        self.gen = torch.Generator().manual_seed(0)

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.tensor([i, int(self.rng.integers(10**6)),
                             int(torch.randint(10**6, (), generator=self.gen))])


def _draws(**kwargs):
    gen = torch.Generator().manual_seed(3)
    return torch.cat(list(stoker.DataLoader(_OwnsGenerators(), batch_size=4, generator=gen,
                                            **kwargs)))


def test_dataset_generators_are_reseeded_per_batch_whatever_the_executor():
    reference = _draws(seeding="per_batch")
    for kwargs in ({"num_workers": 2}, {"worker_type": "thread"}):
        assert torch.equal(reference, _draws(seeding="per_batch", **kwargs))
    assert len(set(reference[:, 1].tolist())) == 16  # no repeats across workers or batches


def test_torch_seeding_tells_of_dataset_generators_copied_into_workers(caplog):
    # Told on stoker's logger and in stats().advice, not through warnings (issue 44).
    gen = torch.Generator().manual_seed(3)
    loader = stoker.DataLoader(_OwnsGenerators(), batch_size=4, generator=gen, num_workers=2,
                               seeding="per_worker")
    with caplog.at_level(logging.WARNING, "stoker.sampling.dataset_rngs"), \
            warnings.catch_warnings():
        warnings.simplefilter("error")
        draws = torch.cat(list(loader))
    message = [r.getMessage() for r in caplog.records if r.name == "stoker.sampling.dataset_rngs"]
    assert message == list(loader.stats().advice) == [
        "stoker: dataset.rng is a numpy.random._generator.Generator created before the workers "
        "started; each of the 2 workers gets an identical copy, so the random draws from it "
        "repeat across workers, as under torch. Draw from stoker.sample_rng() in __getitem__ "
        "instead, or pass seeding='per_batch' (or beyond_torch={'per_batch_seeding'}), which "
        "reseeds it per batch."
    ]
    assert draws[:4, 1].tolist() == draws[4:8, 1].tolist()  # torch's behaviour: repeated


class _TouchesCuda(torch.utils.data.Dataset):
    """Raises what torch raises when a forked worker touches a CUDA context it inherited."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        raise RuntimeError("CUDA error: initialization error")


def test_cuda_used_inside_a_worker_explains_the_fix():
    from stoker.workers.remote_errors import CUDA_HINT

    with pytest.raises(RuntimeError, match="initialization error") as info:
        list(stoker.DataLoader(_TouchesCuda(), batch_size=2, num_workers=2))
    assert CUDA_HINT in info.value.__notes__
