"""Dataset metadata shared with workers instead of copied into each (copy-on-read).
``SharedStrList``, ``SharedBytesList`` and ``SharedList`` hold paths, labels and records in one
shared-memory buffer; see ``shared_list``."""

import typing as _typing

from stoker._core.lazy_exports import lazy_exports as _lazy_exports

# NOTE [ Import only what the loader needs ]: the engine imports modules of this package.
_LAZY = {name: "stoker.sharing.shared_list"
         for name in ("SharedBytesList", "SharedList", "SharedStrList")}
__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)

if _typing.TYPE_CHECKING:
    from stoker.sharing.shared_list import SharedBytesList, SharedList, SharedStrList

__all__ = ["SharedBytesList", "SharedList", "SharedStrList"]
