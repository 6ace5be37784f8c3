"""A program whose loop runs in a daemon thread, for ``test_voice_as_torch.py``: the main
thread's last line runs while the loop waits for a sample that never comes, so the
interpreter exits with the loader's worker still up. Run as::

    STOKER_PROBE_LOADER=torch|stoker python _daemon_thread_at_exit_script.py

Under torch it prints one line and exits 0, nothing on stderr; so must it under stoker (NOTE
[ A daemon thread's loader at exit ]).
"""

from __future__ import annotations

import os
import threading

import torch.utils.data as tud

NEVER_WRITTEN, _KEEP_OPEN = os.pipe()  # the slow sample reads from it: it never returns


class SlowThird(tud.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        if i == 2:
            os.read(NEVER_WRITTEN, 1)
        return i


def main() -> None:
    if os.environ["STOKER_PROBE_LOADER"] == "stoker":
        import stoker

        loader_cls = stoker.DataLoader
    else:
        loader_cls = tud.DataLoader
    second = threading.Event()

    def loop() -> None:
        for batch in loader_cls(SlowThird(), batch_size=1, num_workers=1):
            if batch.item() == 1:
                second.set()

    threading.Thread(target=loop, daemon=True).start()
    assert second.wait(120), "no second batch"
    print("main done", flush=True)


if __name__ == "__main__":
    main()
