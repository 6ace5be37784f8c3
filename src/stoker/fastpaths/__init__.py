"""Fast paths that rely on interpreter or library internals (batched ``__getitem__`` from
source, ``dataset[index_tensor]``, loading plain gathers inline, torch's collate patched in
workers)."""
