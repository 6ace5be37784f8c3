"""torch-compatible collation that can write batches straight into transport memory.

``default_collate``/``collate``/``default_convert`` give torch's results and errors (see
NOTE [ Collate compatibility with torch ] in ``default.py``); inside ``allocating_into`` the
batch tensors are born in the allocator's memory (NOTE [ Collating into shared memory ] in
``stoker._core.protocols``).
"""

from stoker.collate._alloc import allocating_into, current_allocator
from stoker.collate.default import (
    collate,
    default_collate,
    default_collate_err_msg_format,
    default_collate_fn_map,
    default_convert,
)

__all__ = [
    "allocating_into",
    "collate",
    "current_allocator",
    "default_collate",
    "default_collate_err_msg_format",
    "default_collate_fn_map",
    "default_convert",
]
