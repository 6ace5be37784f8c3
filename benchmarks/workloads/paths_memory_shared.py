"""`paths_memory_shared`: `paths_memory` with its 2,000,000 paths in a
`stoker.formats.SharedStrList` (one shared buffer + offsets) instead of a Python list.
Workers read fresh str objects built from shared memory, so nothing is copied into them and
the process tree's PSS stays near the PSS before the loader. Same loader arguments as
`paths_memory`; compare the two workloads' `peak_pss_mib` and `peak_pss_ratio_to_before`.
Extra fields: `list_bytes` (deep size of the Python list), `container_bytes` (the shared
buffer) and `construct_s` (time to build the SharedStrList from the list)."""

from __future__ import annotations

import sys
import time
from typing import Any

from _harness import Context, Plan, compare

from stoker.sharing import SharedStrList
from workloads.paths_memory import PathsDataset


class SharedPathsDataset(PathsDataset):
    """`PathsDataset` whose `paths` list is replaced by a SharedStrList of the same strings."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.list_bytes = sys.getsizeof(self.paths) + sum(map(sys.getsizeof, self.paths))
        start = time.perf_counter()
        self.paths = SharedStrList(self.paths)  # type: ignore[assignment]
        self.construct_s = time.perf_counter() - start


def run(ctx: Context) -> list[dict[str, Any]]:
    n = 50_000 if ctx.quick else 2_000_000
    dataset = SharedPathsDataset(n)
    kwargs = {"batch_size": 256, "shuffle": True, "num_workers": 2}

    def extra(record: dict[str, Any]) -> dict[str, Any]:
        return {
            "paths": n,
            "list_bytes": dataset.list_bytes,
            "container_bytes": dataset.paths.nbytes,  # type: ignore[attr-defined]
            "construct_s": dataset.construct_s,
        }

    plan = Plan(epochs=1, warmup_batches=0)
    return compare(ctx, "paths_memory_shared", dataset, kwargs, plan, extra=extra)
