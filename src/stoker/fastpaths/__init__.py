"""Fast paths that rely on interpreter or library internals (batched ``__getitem__`` from
source, ``dataset[index_tensor]`` for datasets that promise it, loading plain gathers inline,
torch's collate patched in workers, raw RNG-state copies), all behind one switch: NOTE [ One
switch for the fast paths ] in ``switch``."""
