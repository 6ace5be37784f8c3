"""torch's own ``default_collate``, called by a user's ``collate_fn`` inside a stoker worker.

NOTE [ torch's collate in stoker workers ]
Many ``collate_fn``s post-process ``torch.utils.data.default_collate(batch)``. Inside a worker
(``get_worker_info()`` is set, as stoker sets it) torch's ``collate_tensor_fn`` allocates every
output tensor in a new shared-memory segment: for a batch of 64 224x224 images, 9.6 MB of fresh
pages, ~10 ms, which stoker then copies into its slab. In stoker's worker processes (never in
the user's main process) the tensor entry of torch's ``default_collate_fn_map`` is therefore
stoker's ``collate_tensor_fn``: the same values, dtype and shape and the same errors, with the
output allocated in the batch's slab (or in ordinary memory outside one). A map the user
changed is left alone. Only with ``slab_transport`` (NOTE [ Same as torch unless asked ]):
without slabs torch's own function runs, and its shared-memory outputs are what torch's
reductions send (NOTE [ Batches cross as torch's do ]).
"""

from __future__ import annotations

import torch
from torch.utils.data._utils import collate as _torch_collate

from stoker.collate._leaves import collate_tensor_fn


def collate_into_slabs_in_this_worker() -> bool:
    """Point torch's default tensor collation at stoker's; True if it was torch's stock one."""
    fn_map = _torch_collate.default_collate_fn_map
    if fn_map.get(torch.Tensor) is not _torch_collate.collate_tensor_fn:
        return False
    fn_map[torch.Tensor] = collate_tensor_fn
    return True
