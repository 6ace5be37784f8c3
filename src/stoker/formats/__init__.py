"""Record formats. ``SharedStrList``, ``SharedBytesList`` and ``SharedList`` hold dataset
metadata (paths, labels, records) in one shared-memory buffer, so workers do not copy it
(copy-on-read); see ``shared_list``."""

from stoker.formats.shared_list import SharedBytesList, SharedList, SharedStrList

__all__ = ["SharedBytesList", "SharedList", "SharedStrList"]
