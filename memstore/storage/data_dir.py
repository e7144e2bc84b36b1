"""``data_dir``: the folder of the embedded SQLite database and of the file provider's tree.

Its default, ``./.memstore``, is relative to the working directory, so a CLI run in one directory
and a gateway started in another use two different databases without a word. ``data_dir_of``
says so once per process (and folder), at WARNING: the quickstart's trap made visible.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from memstore.config import MemoryConfig

logger = logging.getLogger(__name__)

_warned: set[Path] = set()
_warned_lock = threading.Lock()


def data_dir_of(config: MemoryConfig) -> Path:
    """``config.data_dir``, absolute; warns once when it is the default, which follows the cwd."""
    path = Path(config.data_dir).expanduser().resolve()
    if "data_dir" not in config.model_fields_set and not Path(config.data_dir).is_absolute():
        with _warned_lock:
            first = path not in _warned
            _warned.add(path)
        if first:
            logger.warning(
                "data_dir is not set: memstore keeps its data in %s, relative to the working directory, "
                "so a process started elsewhere (a gateway, the CLI) uses another database; set "
                "MEMSTORE_DATA_DIR to an absolute path, or database_url",
                path,
            )
    return path
