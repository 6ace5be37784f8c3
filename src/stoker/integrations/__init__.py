"""Training frameworks that rebuild or wrap a DataLoader, taught to keep stoker's engine.

``accelerate``: NOTE [ Accelerate keeps stoker ] (``accelerator.prepare``,
``skip_first_batches``, and so Hugging Face ``Trainer``). ``lightning``: the one loader
state Lightning's checkpoints keep for all ranks carries every rank's part (NOTE [ Every rank's
part ]); ``accelerate_state``: beside Accelerate's one loader file, each rank saves and loads its
own (NOTE [ Accelerate's one loader file ]). Otherwise Lightning and
DCP need no code here: the loader pickles (NOTE [ Loader pickling ]), reads ranks when iteration
starts, and keeps its state's keys constant (NOTE [ Constant state keys ]).
"""
