"""Training frameworks that rebuild or wrap a DataLoader, taught to keep stoker's engine.

``accelerate``: NOTE [ Accelerate keeps stoker ] (``accelerator.prepare``,
``skip_first_batches``, and so Hugging Face ``Trainer``). ``accelerate_state`` and
``lightning``: the one loader state Accelerate's ``save_state`` and Lightning's checkpoints keep
for all ranks carries every rank's part (NOTE [ Every rank's part ]). Otherwise Lightning and
DCP need no code here: the loader pickles (NOTE [ Loader pickling ]), reads ranks when iteration
starts, and keeps its state's keys constant (NOTE [ Constant state keys ]).
"""
