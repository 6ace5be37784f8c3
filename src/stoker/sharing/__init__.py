"""Dataset metadata shared with workers instead of copied into each (copy-on-read).
``SharedStrList``, ``SharedBytesList`` and ``SharedList`` hold paths, labels and records in one
shared-memory buffer; see ``shared_list``."""

from stoker.sharing.shared_list import SharedBytesList, SharedList, SharedStrList

__all__ = ["SharedBytesList", "SharedList", "SharedStrList"]
