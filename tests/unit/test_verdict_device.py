"""The verdict with device= (recorded stats): copies the training stream waited for, split
into bandwidth-bound and not-overlapped; queuing copies versus waiting for workers."""

from __future__ import annotations

from stoker._core.stats import LoaderStats
from stoker.profile.verdict import summarize

_HEAD = "stoker: 100 batches, 640 samples/s; the loop waited for data 5% of the time."


def _device_stats(**kw) -> LoaderStats:
    # 100 batches of 38.5 MB (256x3x224x224 uint8 is 38,535,168 bytes) over 10 s of loop.
    base = dict(batches=100, samples=6400, num_workers=4, wait_s=0.5, loop_s=9.5,
                fetch_wall_s=5, fetch_cpu_s=5, concurrency=(1, 1, 1, 1),
                device_batches=100, device_bytes=100 * 38_535_168)
    base.update(kw)
    return LoaderStats(**base)


def test_the_copy_engine_busy_all_the_time_is_bandwidth_bound():
    text = summarize(_device_stats(device_copy_s=9.0, device_wait_s=3.0))
    assert text == _HEAD[:-1] + (
        ". Input-bound on the copy to the device: the training stream waited 30% of the time "
        "for host-to-device copies (36.8 MiB a batch at 0.4 GB/s; the copy stream was busy "
        "90% of the time): host-to-device bandwidth is the bottleneck; send fewer bytes "
        "(uint8 images, converted to float in device_transform; decode JPEGs on the GPU with "
        "stoker.image.DecodeImages)."
    )


def test_copies_that_do_not_overlap_the_step_ask_for_more_prefetch():
    text = summarize(_device_stats(device_copy_s=3.0, device_wait_s=2.0))
    assert text.endswith(
        "(36.8 MiB a batch at 1.3 GB/s; the copy stream was busy 30% of the time): the copies "
        "do not overlap the step; raise device_prefetch so more are queued ahead."
    )


def test_a_short_device_wait_is_not_blamed():
    text = summarize(_device_stats(device_copy_s=3.0, device_wait_s=0.5))
    assert text == _HEAD[:-1] + ". Not input-bound: the training step is the bottleneck."


def test_queuing_the_copies_is_told_apart_from_waiting_for_workers():
    text = summarize(_device_stats(wait_s=5.0, loop_s=5.0, to_device_s=4.0, device_copy_s=1.0))
    assert text.endswith(
        "Input-bound: queuing the copies to the device takes 80% of the time next() blocks: "
        "tensors outside stoker's page-locked slabs are copied from pageable memory, "
        "synchronously (num_workers=0, worker_type='thread', or the slabs could not be "
        "registered); use num_workers > 0, or make device_transform cheaper."
    )
    workers = summarize(_device_stats(wait_s=5.0, loop_s=5.0, to_device_s=0.2,
                                      device_copy_s=1.0))
    assert "queuing the copies" not in workers and "Input-bound: " in workers


def test_a_device_transform_that_takes_the_time_is_named_not_the_copies():
    """The GPU decode in device_transform (the issue 46 step: 65% of next() blamed on
    "pageable memory") is named as what it is, with the decode advice."""
    text = summarize(_device_stats(wait_s=5.0, loop_s=5.0, to_device_s=4.0,
                                   device_transform_s=3.5, device_copy_s=1.0))
    assert text.endswith(
        "Input-bound: the device_transform takes 70% of the time next() blocks (it runs on the "
        "training thread, before each batch is handed out); make device_transform cheaper; a "
        "GPU decode (stoker.image.DecodeImages) there costs the training thread's time: where "
        "the CPU cores keep up, decode in the workers with stoker's image path instead "
        "(docs/gpu_feed.md, \"Which decode\")."
    ), text
