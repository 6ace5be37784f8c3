"""The message protocol between the main process and a worker (one duplex socket each).

main -> worker
    (TASK, epoch, task_id, indices, released)  fetch and collate one batch; ``released`` lists
                                               slab ids the main process no longer uses
    (RESET, epoch, released)                   new epoch for persistent workers: restart the
                                               iterable dataset, forget the old epoch
    (STOP,)                                    exit now
worker -> main
    (HELLO, has_log)   first message; when ``has_log`` the fd of its stack log follows
    (SLAB, ref)        a new slab; on Linux its fd follows at once (SCM_RIGHTS)
    (DONE, epoch, task_id, segment_id, used, payload, retired, skipped, info)
                       ``info`` = (concurrency, fetch wall s, fetch CPU s, collate s, pack s,
                       new tuner decisions, which batched form fetched it whole ("" for none),
                       s queued for a CPU since the last report): stats, and the worker
                       asks for more tasks in flight when its concurrency outgrows
                       prefetch_factor
    (FAILED, epoch, task_id, RemoteError)
    (EXHAUSTED, epoch, task_id)  the iterable dataset ended in this worker

Every reply carries its epoch so that replies to an abandoned epoch (``break`` with persistent
workers) are recognised and their slabs recycled instead of being delivered.
"""

TASK, RESET, STOP = 0, 1, 2
SLAB, DONE, FAILED, EXHAUSTED, HELLO = 10, 11, 12, 13, 14
