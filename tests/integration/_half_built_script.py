"""A script that catches an error raised while a worker iterator is built, then goes on, for
``test_voice_as_torch.py`` (NOTE [ torch's half-built iterator ]). Run as::

    STOKER_PROBE_LOADER=torch|stoker python _half_built_script.py sampler|pin_warning

``sampler``: a batch_sampler whose ``__iter__`` raises (not a generator: at ``iter()``);
``pin_warning``: ``pin_memory=True`` without an accelerator, under ``simplefilter("error")``.
"""

from __future__ import annotations

import gc
import os
import sys
import warnings

import torch.utils.data as tud


class NoBuckets:
    def __iter__(self):  # noqa: ANN204
        raise ValueError("no buckets configured")

    def __len__(self) -> int:
        return 2


def main(mode: str) -> None:
    if os.environ["STOKER_PROBE_LOADER"] == "stoker":
        import stoker

        loader_cls = stoker.DataLoader
    else:
        loader_cls = tud.DataLoader
    if mode == "sampler":
        loader = loader_cls(list(range(8)), batch_sampler=NoBuckets(), num_workers=2,
                            timeout=120)
        caught: type[BaseException] = ValueError
    else:
        warnings.simplefilter("error")
        loader = loader_cls(list(range(8)), batch_size=2, num_workers=2, pin_memory=True,
                            timeout=120)
        caught = UserWarning
    try:
        iter(loader)
    except caught as exc:
        print("caught:", exc, flush=True)
    gc.collect()
    print("after:", [b.tolist() for b in loader_cls(list(range(4)), batch_size=2)], flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
