"""The file provider: one JSON document per scope, in DeerFlow's directory layout.

Select it with ``storage_class: memstore.storage.file.FileMemoryStorage``.
"""

from memstore.storage.file.layout import FILE_NAME
from memstore.storage.file.provider import FileMemoryStorage

__all__ = ["FILE_NAME", "FileMemoryStorage"]
