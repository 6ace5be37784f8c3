"""``stoker.DataLoader``'s arguments beyond torch's: their option types and what each does
(the class's docstring, kept here so ``loader.py`` holds the code: ``DOC``)."""

from typing import Literal

Seeding = Literal["per_batch", "per_worker"]
ShardEven = Literal["pad", "drop", "exact"]
OnError = Literal["raise", "skip"]
WorkerType = Literal["auto", "process", "thread"]

DOC = """\
Drop-in replacement for :class:`torch.utils.data.DataLoader`; same arguments, same batches.

Extra keyword-only arguments (all optional):

worker_type: ``"process"``: ``num_workers`` worker processes (torch's meaning), each
    fetching with a thread pool sized by ``worker_concurrency``; ``"thread"``: fetches run
    on threads of the main process, no processes (map-style datasets only); ``"auto"``
    (default): processes when ``num_workers > 0``, else the calling thread; with
    ``beyond_torch`` naming ``"inline_gathers"`` also the calling thread when every batch
    is plain array gathers read from ``__getitem__``'s source (NOTE [ Gathers need no
    workers ]; ``stats().inline`` says so).
worker_concurrency: samples each worker fetches at once. ``"auto"`` (default): one, as in
    torch, unless the dataset class declares ``stoker_thread_safe = True``; then measured
    per worker and raised while throughput rises for fetches that mostly wait (I/O). An
    ``int`` runs that many ``__getitem__`` calls at once on threads. Either opt-in promises
    that ``__getitem__`` is thread-safe (no shared file handle, connection or
    ``signal.alarm``) and draws randomness only from ``stoker.sample_rng()`` /
    ``sample_generator()``; ``stats()`` says what it would give (NOTE [ Automatic
    concurrency ]).
beyond_torch: ``None`` (default) reads ``STOKER_BEYOND_TORCH`` (unset: nothing beyond
    torch); ``True`` turns on everything stoker does beyond torch's behaviour; a set of
    names turns on those: ``"per_batch_seeding"``, ``"inline_gathers"``,
    ``"batched_getitem"``, ``"deep_prefetch"``, ``"move_stragglers"``,
    ``"epoch_autopilot"``, ``"shared_lists"``, ``"slab_transport"``, ``"keep_slabs"``,
    ``"thread_caps"``, ``"gc_freeze"``, ``"cuda_forkserver"``, ``"profiler_ranges"``,
    ``"pickle_once"``. Each changes something a program can observe (NOTE [ Same as torch
    unless asked ] says what; the audit table in docs/same_as_torch.md lists every
    mechanism).
seeding: ``None`` (default): torch's seeding (each worker seeded once at start with base
    seed + worker id), or per batch when ``beyond_torch`` names ``"per_batch_seeding"``.
    ``"per_batch"`` reseeds ``random``, numpy's global RNG and torch's default generator
    before every batch from (base seed, epoch, batch position), in whichever process
    fetches it, so random augmentations do not depend on ``num_workers`` and resume across
    ``num_workers``; with ``num_workers=0`` the caller's RNG states are restored after
    each fetch. ``"per_worker"`` is torch's behaviour; its states resume with the same
    ``num_workers`` (NOTE [ Worker streams resume ], NOTE [ Main streams resume ]).
stall_warning_s: with workers, if no batch arrives for this long, warn once (per stall)
    naming the busy workers, the samples they hold and their current Python stacks, and
    keep waiting. ``None`` turns it off. ``timeout`` still fails hard, with the same report.
shard: split a map-style dataset across ``torch.distributed`` ranks (or torchrun's
    ``RANK``/``WORLD_SIZE``) without a sampler: each rank reads its share of every epoch's
    order (shuffled when ``shuffle=True``). IterableDatasets shard themselves with
    ``stoker.distributed.shard_info()`` (``shard_id``/``num_shards``) or
    ``stoker.distributed.shard_iterable``.
on_error: ``"raise"`` (torch's behaviour) or ``"skip"``: a sample whose fetch raises is left
    out of its batch (a batch may come out smaller; one with no sample left is not
    yielded), logged once on the ``stoker`` logger and counted; more than ``skip_budget``
    skipped samples in an epoch raise ``SkipBudgetExceeded``. Map-style datasets only.
skip_budget: an int is a number of samples per epoch; a float in [0, 1) a fraction of the
    epoch's samples. Default 0.01 (1%).
snapshot_every_n_steps: accepted for torchdata ``StatefulDataLoader`` compatibility and
    checked (``None`` or an int >= 0, as torchdata takes them); it changes nothing:
    ``state_dict()`` is always the state after the last delivered batch, kept by the main
    process at no cost per step (torchdata ships state from its workers every n steps and
    replays the steps since).
collect_stats: ``True`` (default): measure where time goes, per batch, for
    ``loader.stats()`` (a few microseconds a batch); ``False`` measures nothing in the
    main process and ``stats()`` says so.
device: hand out every tensor of each batch on this CUDA device (``"cuda"``,
    ``"cuda:1"``, a ``torch.device``); ``None`` (default) keeps batches on the CPU, as torch
    does. Copies run on a side stream of stoker's, ``device_prefetch`` batches ahead; your
    current stream waits for them on an event (no synchronize), and slabs are page-locked
    in place, so nothing is copied on the host (NOTE [ Batches on the device ]).
device_prefetch: batches whose copies are queued ahead of the one handed out (default 1;
    none under torch's seeding with ``num_workers=0``, where a batch loaded ahead would
    draw from the caller's global RNGs before the caller's step: NOTE [ Main streams
    resume ]).
device_transform: a function run on the device right after each batch's copy, on the copy
    stream (``uint8`` -> ``float``, normalize, ``channels_last``, GPU image decoding with
    ``stoker.image.DecodeImages``); it receives the batch on the device and returns the
    batch to hand out.
shard_even: how ranks get the same number of steps, so DDP never hangs at the end of an
    epoch: ``"pad"`` repeats samples from the start (DistributedSampler's default),
    ``"drop"`` drops the tail, ``"exact"`` reads every sample once and gives a short rank
    ``stoker.EndOfData`` steps (for evaluation).
fast_paths: ``True`` (default): the exact fast paths that rely on interpreter or library
    internals (a batched ``__getitem__`` read from its source, lists read in place by
    forked workers, raw RNG-state copies, ...). ``False`` (or ``STOKER_FAST_PATHS=0`` in
    the environment) turns them all off: ``__getitem__`` is called per sample, for
    debugging (NOTE [ One switch for the fast paths ]).
"""
