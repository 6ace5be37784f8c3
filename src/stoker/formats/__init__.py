"""Record formats: datasets over data at rest (shards, columnar files, key-value stores).

``SharedStrList``, ``SharedBytesList`` and ``SharedList`` lived here in stoker 0.1; they are
in ``stoker.sharing`` now and stay importable from here for code written against 0.1.
"""

from stoker.sharing.shared_list import SharedBytesList, SharedList, SharedStrList

__all__ = ["SharedBytesList", "SharedList", "SharedStrList"]
