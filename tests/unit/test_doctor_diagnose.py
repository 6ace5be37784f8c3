"""`stoker doctor`'s diagnosis from recorded figures: each bottleneck kind gives its verdict
and its advice, and the candidate settings tried for it."""

from __future__ import annotations

import pytest

from stoker._core.stats import LoaderStats
from stoker.doctor.candidates import THREAD_SAFE_PROMISE, candidates, code_line
from stoker.doctor.diagnose import Setup, diagnose

PROCESSES = Setup(num_workers=2, worker_type="process", cores=2)


def _stats(**kw) -> LoaderStats:
    base = dict(batches=100, samples=800, num_workers=2, wait_s=9.0, loop_s=1.0,
                concurrency=(1, 1))
    base.update(kw)
    return LoaderStats(**base)


def test_a_loop_that_rarely_waits_is_consumer_bound() -> None:
    d = diagnose(_stats(wait_s=0.5, loop_s=9.5, fetch_wall_s=1.0, fetch_cpu_s=1.0), PROCESSES)
    assert d.kind == "consumer" and not d.input_bound
    assert d.headline == ("Not input-bound: the training loop waited for data 5% of the time; "
                          "the training step is the bottleneck.")
    assert "Nothing in the loader will make training faster" in d.advice


def test_fetches_waiting_off_cpu_are_storage_bound() -> None:
    d = diagnose(_stats(fetch_wall_s=20.0, fetch_cpu_s=1.0), PROCESSES)
    assert d.kind == "storage" and d.input_bound
    assert "The workers are blocked off a CPU 95% of their time" in d.headline
    assert d.advice.startswith("Raise num_workers (num_workers=4), or if __getitem__ is "
                               "thread-safe")
    wait = next(x for x in d.shares
                if x.name == "blocked: storage / sleeps / locks in __getitem__")
    assert wait.seconds == pytest.approx(19.0)


def test_a_dataset_drawing_from_the_global_rngs_is_not_advised_threads() -> None:
    d = diagnose(_stats(fetch_wall_s=20.0, fetch_cpu_s=1.0), PROCESSES, draws_global_rng=True)
    assert d.kind == "storage" and "thread-safe" in d.advice
    assert "worker_concurrency" not in d.advice and "(threads inside a worker are out" in d.advice


def test_threads_waiting_while_their_process_burns_a_core_are_gil_bound() -> None:
    threads = Setup(num_workers=0, worker_type="thread", cores=2)
    # 4 fetch threads, 8 CPU-seconds in 10 s of loop: one core busy, the rest waiting.
    d = diagnose(_stats(num_workers=0, concurrency=(4,), fetch_wall_s=20.0, fetch_cpu_s=8.0),
                 threads)
    assert d.kind == "gil"
    assert "they wait for the GIL, not storage" in d.headline
    assert d.advice == 'Use processes: worker_type="process", num_workers=2.'
    assert any(x.name == "blocked: GIL (inferred), fetch threads waiting for each other"
               for x in d.shares)


def test_gil_bound_threads_on_a_busy_machine_queue_instead_of_running() -> None:
    threads = Setup(num_workers=0, worker_type="thread", cores=2)
    # Other processes hold the cores: the threads ran 3 s and were runnable-but-queued 6 s.
    d = diagnose(_stats(num_workers=0, concurrency=(4,), fetch_wall_s=20.0, fetch_cpu_s=3.0,
                        fetch_queued_s=6.0), threads)
    assert d.kind == "gil"


def test_threads_waiting_with_an_idle_process_are_storage_not_gil() -> None:
    threads = Setup(num_workers=0, worker_type="thread", cores=2)
    d = diagnose(_stats(num_workers=0, concurrency=(4,), fetch_wall_s=20.0, fetch_cpu_s=1.0),
                 threads)
    assert d.kind == "storage"


def test_one_fetch_at_a_time_is_never_gil() -> None:
    d = diagnose(_stats(concurrency=(1, 1), fetch_wall_s=20.0, fetch_cpu_s=15.0), PROCESSES)
    assert d.kind != "gil"


def test_loading_in_the_training_thread() -> None:
    inline = Setup(num_workers=0, worker_type="auto", cores=2)
    d = diagnose(_stats(num_workers=0, concurrency=(), fetch_wall_s=8.5, fetch_cpu_s=8.4),
                 inline)
    assert d.kind == "main_thread"
    assert d.advice == "Load in worker processes: num_workers=2 (this machine has 2 cores)."


def test_receiving_batches_is_transfer_bound() -> None:
    d = diagnose(_stats(fetch_wall_s=4.0, fetch_cpu_s=4.0, unpack_s=4.0), PROCESSES)
    assert d.kind == "transfer"
    assert "Moving batches from the workers to the main process is the cost" in d.headline
    assert "larger batches" in d.advice


def test_collate_heavier_than_fetch_is_collate_bound() -> None:
    d = diagnose(_stats(fetch_wall_s=2.0, fetch_cpu_s=2.0, collate_s=6.0), PROCESSES)
    assert d.kind == "collate"
    assert "collating (6.00 s) than fetching (2.00 s)" in d.headline
    assert "__getitems__" in d.advice


def test_cpu_bound_workers() -> None:
    d = diagnose(_stats(fetch_wall_s=9.5, fetch_cpu_s=9.2, collate_s=0.3), PROCESSES)
    assert d.kind == "cpu"
    assert d.advice == ("Make __getitem__ cheaper (faster decoding, smaller images): the 2 "
                        "workers already use the machine's 2 cores.")
    one = Setup(num_workers=1, worker_type="process", cores=2)
    d = diagnose(_stats(num_workers=1, concurrency=(1,), fetch_wall_s=9.5, fetch_cpu_s=9.2,
                        collate_s=0.3), one)
    assert d.advice == "Use all 2 cores (num_workers=2), then make __getitem__ cheaper."


def test_queued_for_a_cpu_with_more_threads_than_cores_is_oversubscribed() -> None:
    four = Setup(num_workers=4, worker_type="process", cores=2)
    stats = _stats(num_workers=4, concurrency=(1, 1, 1, 1), fetch_wall_s=10.0,
                   fetch_cpu_s=5.0, fetch_queued_s=4.8)
    d = diagnose(stats, four)
    assert d.kind == "oversubscribed" and d.advice == ("Use num_workers=2, or make __getitem__ "
                                                       "cheaper.")


def test_queued_for_a_cpu_within_the_cores_is_a_busy_machine_not_oversubscription() -> None:
    one = Setup(num_workers=1, worker_type="process", cores=2)
    stats = _stats(num_workers=1, concurrency=(1,), fetch_wall_s=10.0, fetch_cpu_s=5.0,
                   fetch_queued_s=4.8)
    d = diagnose(stats, one)
    assert d.kind == "contention" and "too busy to tell" in d.headline


def test_candidates_for_storage_start_with_concurrency_marked_opt_in() -> None:
    found = candidates({"batch_size": 8, "num_workers": 2, "worker_concurrency": 1},
                       "storage", cores=2, cuda=False)
    assert dict(found[0].overrides) == {"num_workers": 2, "worker_concurrency": 8}
    assert found[0].opt_in == THREAD_SAFE_PROMISE
    assert dict(found[1].overrides) == {"worker_type": "thread", "worker_concurrency": 16}
    assert dict(found[2].overrides) == {"num_workers": 8, "worker_concurrency": 1}
    assert not found[2].opt_in
    assert all("pin_memory" not in c.overrides for c in found)


def test_candidates_for_gil_start_with_processes() -> None:
    found = candidates({"worker_type": "thread", "worker_concurrency": 4}, "gil", cores=2,
                       cuda=False)
    assert dict(found[0].overrides) == {"worker_type": "process", "num_workers": 2,
                                        "worker_concurrency": 1}
    assert all(c.overrides.get("worker_type") == "process" for c in found
               if "num_workers" in c.overrides)


def test_candidates_for_cpu_never_repeat_the_users_setting() -> None:
    kwargs = {"batch_size": 8, "num_workers": 2, "prefetch_factor": 2}
    found = candidates(kwargs, "cpu", cores=2, cuda=True, limit=3)
    assert len(found) == 3
    assert {"num_workers": 2} not in [dict(c.overrides) for c in found]
    assert dict(found[0].overrides) == {"num_workers": 1}
    assert dict(found[1].overrides) == {"prefetch_factor": 4}
    assert dict(found[2].overrides) == {"pin_memory": True}


def test_code_line_shows_plain_arguments_and_the_change() -> None:
    kwargs = {"batch_size": 64, "sampler": object(), "num_workers": 1, "timeout": 0}
    assert code_line(kwargs, {"num_workers": 2, "worker_type": "process"}) == (
        'stoker.DataLoader(dataset, ..., batch_size=64, num_workers=2, worker_type="process")'
    )
    assert code_line({"batch_size": 8}, {}) == "stoker.DataLoader(dataset, batch_size=8)"


def test_with_cuda_the_device_feed_and_pinning_are_tried() -> None:
    found = candidates({"batch_size": 8, "num_workers": 2}, "cpu", cores=2, cuda=True)
    overrides = [dict(c.overrides) for c in found]
    assert {"pin_memory": True} in overrides and {"device": "cuda"} in overrides
    found = candidates({"batch_size": 8, "num_workers": 2, "device": "cuda"}, "cpu", cores=2,
                       cuda=True)
    assert all("device" not in c.overrides and "pin_memory" not in c.overrides for c in found)


def test_a_stoker_loaders_arguments_come_back_from_its_attributes() -> None:
    import torch

    import stoker
    from stoker.doctor.loader_kwargs import kwargs_of

    data = torch.utils.data.TensorDataset(torch.arange(10))
    loader = stoker.DataLoader(data, batch_size=4, shuffle=True, num_workers=2,
                               worker_concurrency=3, drop_last=True)
    kwargs = kwargs_of(loader)
    assert kwargs["batch_size"] == 4 and kwargs["drop_last"] is True
    assert kwargs["shuffle"] is True and "sampler" not in kwargs  # what the user wrote
    assert kwargs["num_workers"] == 2 and kwargs["worker_concurrency"] == 3
    assert kwargs["prefetch_factor"] == 2 and "collate_fn" not in kwargs
    assert "device" not in kwargs
    rebuilt = stoker.DataLoader(data, **kwargs)
    assert len(rebuilt) == len(loader) == 2


def test_your_setting_is_what_the_user_wrote_with_the_defaults_marked() -> None:
    import torch

    import stoker
    from stoker.doctor.loader_kwargs import kwargs_of
    from stoker.doctor.measure import Run
    from stoker.doctor.records import plain_kwargs
    from stoker.doctor.report import Context, _header

    data = torch.utils.data.TensorDataset(torch.arange(64))
    setup = Setup(num_workers=2, worker_type="process", cores=2)
    for loader in (stoker.DataLoader(data, batch_size=32, shuffle=True, num_workers=2),
                   torch.utils.data.DataLoader(data, batch_size=32, shuffle=True,
                                               num_workers=2)):
        for kwargs in (kwargs_of(loader), plain_kwargs(kwargs_of(loader))):  # factory, script
            lines = _header(Context("train:make_loader", kwargs, setup, 0.0), Run("r", {}))
            assert lines[1:3] == [
                "  your setting: stoker.DataLoader(dataset, batch_size=32, shuffle=True, "
                "num_workers=2)",
                '    left at their defaults: prefetch_factor=2, persistent_workers=False, '
                'pin_memory=False, worker_type="auto", worker_concurrency="auto", '
                "beyond_torch=None",
            ], (type(loader), lines)
    # a sampler of the user's own is an object: shown as "...", and what it is not told
    given = {"batch_size": 8, "sampler": object(), "num_workers": 2, "prefetch_factor": 4,
             "beyond_torch": True}
    lines = _header(Context("m:f", given, setup, 0.0), Run("r", {}))
    assert lines[1:3] == [
        "  your setting: stoker.DataLoader(dataset, ..., batch_size=8, num_workers=2, "
        "prefetch_factor=4, beyond_torch=True)",
        '    left at their defaults: persistent_workers=False, pin_memory=False, '
        'worker_type="auto", worker_concurrency="auto"']
    lines = _header(Context("m:f", {"batch_size": 8}, setup, 0.0), Run("r", {}))
    assert lines[1:3] == [
        "  your setting: stoker.DataLoader(dataset, batch_size=8)",
        '    left at their defaults: pin_memory=False, worker_type="auto", '
        'worker_concurrency="auto", beyond_torch=None']
