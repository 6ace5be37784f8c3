"""The message protocol between the main process and a worker (one duplex socket each).

main -> worker
    (TASK, epoch, task_id, indices, released)  fetch and collate one batch; ``released`` lists
                                               slab ids the main process no longer uses
    (RESET, epoch, released)                   new epoch for persistent workers: restart the
                                               iterable dataset, forget the old epoch
    (CANCEL, epoch, task_id)                   give this task back if it has not started
                                               (NOTE [ Idle workers take queued tasks ])
    (RELEASE, released)                        slabs the main process no longer uses, sent
                                               without a task when they are large and the
                                               main process waits for a batch (NOTE
                                               [ Slabs come back before the next task ])
    (STOP,)                                    exit now
worker -> main
    (HELLO, has_log)   first message; when ``has_log`` the fd of its stack log follows
    (SLAB, ref)        a new slab; on Linux its fd follows at once (SCM_RIGHTS)
    (DONE, epoch, task_id, segment_id, used, payload, retired, skipped, info)
                       ``info`` = (concurrency, fetch wall s, fetch CPU s, collate s, pack s,
                       new tuner decisions, which batched form fetched it whole ("" for none),
                       s queued for a CPU since the last report, whether it can give a
                       queued task back, whether worker_init_fn took the seeds, when it
                       finished packing (perf_counter: one clock for all processes on
                       Linux; the doctor's timeline)): stats, and the worker asks for more
                       tasks in flight when its concurrency outgrows prefetch_factor
    (FAILED, epoch, task_id, RemoteError)
    (EXHAUSTED, epoch, task_id)  the iterable dataset ended in this worker
    (CANCELLED, epoch, task_id)  answers a CANCEL: the task was not started and never will be

Each TASK gets exactly one reply: DONE, FAILED, EXHAUSTED or CANCELLED. A CANCEL for a task
already started or answered gets none (the task's own reply follows or went before).

Every reply carries its epoch so that replies to an abandoned epoch (``break`` with persistent
workers) are recognised and their slabs recycled instead of being delivered.
"""

TASK, RESET, STOP, CANCEL, RELEASE = 0, 1, 2, 3, 4
SLAB, DONE, FAILED, EXHAUSTED, HELLO, CANCELLED = 10, 11, 12, 13, 14, 15
