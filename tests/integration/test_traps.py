"""Classic DataLoader traps: accelerator data in workers, mixed devices, dataset-owned RNGs."""

from __future__ import annotations

import logging
import multiprocessing
import warnings

import numpy as np
import pytest
import torch

import stoker
from stoker.engine.cuda_safety import CudaInWorkersError, safe_context

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


class _HoldsMeta(torch.utils.data.Dataset):
    """A dataset holding a tensor on another device that ``__getitem__`` never touches: correct
    under torch, whose forked workers never call into that device."""

    def __init__(self):
        self.labels = torch.ones(4, device="meta")

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i


def test_a_dataset_holding_device_tensors_runs_as_under_torch():
    # Issue 44: refused before the workers started (a CudaInWorkersError) where torch's run
    # succeeds; now loaded as torch loads it.
    got = [b.tolist() for b in stoker.DataLoader(_HoldsMeta(), batch_size=2, num_workers=2)]
    want = [b.tolist() for b in torch.utils.data.DataLoader(_HoldsMeta(), batch_size=2,
                                                            num_workers=2)]
    assert got == want == [[0, 1], [2, 3]]


class _UsesCudaInWorker(torch.utils.data.Dataset):
    """What a worker sees when it touches CUDA its parent initialised: torch's error text."""

    def __init__(self):
        self.labels = torch.ones(4, device="meta")
        self.on_cuda = [torch.ones(1, device="meta")]

    def __len__(self):
        return 4

    def __getitem__(self, i):
        raise RuntimeError("Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
                           "multiprocessing, you must use the 'spawn' start method")


def test_cuda_in_a_worker_keeps_torchs_error_with_the_fix(monkeypatch):
    from stoker.workers import remote_errors

    # The dataset's tensors are on 'meta' here: count them as CUDA's for the note.
    real = torch.Tensor.device
    monkeypatch.setattr(torch.Tensor, "device", property(
        lambda t: torch.device("cuda") if real.__get__(t).type == "meta" else real.__get__(t)))
    loader = stoker.DataLoader(_UsesCudaInWorker(), batch_size=2, num_workers=1)
    with pytest.raises(RuntimeError) as info:
        list(loader)
    assert type(info.value) is RuntimeError  # torch's type, as torch re-raises it
    notes = getattr(info.value, "__notes__", [])
    assert remote_errors.CUDA_HINT + (
        " The dataset holds CUDA tensors: dataset.labels (and 1 more); keep them on the CPU "
        "(dataset.labels = dataset.labels.cpu())."
    ) in notes


class _Picklable(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i


class _Unpicklable(_Picklable):
    def __init__(self):
        self.transform = lambda x: x


def test_cuda_initialised_parent_forks_workers_as_torch_does(monkeypatch, caplog):
    # Issue 44: stoker started them with forkserver (pickling the dataset, other process
    # names) where torch forks them; that is now asked for by name.
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    fork = multiprocessing.get_context("fork")
    plan = stoker.DataLoader(_Unpicklable(), num_workers=2).plan()
    with caplog.at_level(logging.DEBUG, "stoker"), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert safe_context(None, fork, plan) is fork
    assert caplog.records == []


def test_cuda_forkserver_switches_fork_to_forkserver(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    fork = multiprocessing.get_context("fork")
    plan = stoker.DataLoader(_Picklable(), num_workers=2,
                             beyond_torch={"cuda_forkserver"}).plan()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert safe_context(None, fork, plan).get_start_method() == "forkserver"
    explicit = multiprocessing.get_context("fork")
    assert safe_context(explicit, fork, plan) is explicit  # the user's choice stands


def test_cuda_forkserver_with_unpicklable_dataset_says_why(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    plan = stoker.DataLoader(_Unpicklable(), num_workers=2,
                             beyond_torch={"cuda_forkserver"}).plan()
    with pytest.raises(CudaInWorkersError) as info:
        safe_context(None, multiprocessing.get_context("fork"), plan)
    text = str(info.value)
    assert text.startswith(
        "CUDA is already initialised in this process and beyond_torch asks for "
        "'cuda_forkserver', so stoker starts workers with 'forkserver', which pickles what "
        "they need; but the dataset does not pickle ("
    )
    assert text.endswith(
        "). Define the dataset class and functions at module level (no lambdas, open files or "
        "locks), or leave 'cuda_forkserver' off to fork the workers as torch does (they must "
        "then not use CUDA), or use num_workers=0."
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
    # Told in stats().advice and at DEBUG on stoker's logger, not through warnings (issue 44)
    # nor on stderr (NOTE [ Advice is quiet ]).
    gen = torch.Generator().manual_seed(3)
    loader = stoker.DataLoader(_OwnsGenerators(), batch_size=4, generator=gen, num_workers=2,
                               seeding="per_worker")
    with caplog.at_level(logging.DEBUG, "stoker.sampling.dataset_rngs"), \
            warnings.catch_warnings():
        warnings.simplefilter("error")
        draws = torch.cat(list(loader))
    assert {r.levelno for r in caplog.records} == {logging.DEBUG}
    message = [r.getMessage() for r in caplog.records if r.name == "stoker.sampling.dataset_rngs"]
    assert str(loader.stats()).splitlines()[1:] == message  # print(loader.stats()) shows it
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
