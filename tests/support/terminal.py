"""Run the ``memstore`` console script with its output on a pseudo-terminal, as an operator sees it."""

from __future__ import annotations

import fcntl
import os
import pty
import shutil
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

COLUMNS, ROWS = 160, 40


def memstore_executable() -> str:
    executable = shutil.which("memstore", path=str(Path(sys.executable).parent))
    assert executable is not None
    return executable


def run_on_terminal(
    env: dict[str, str],
    *args: str,
    stdout_too: bool = False,
    columns: int = COLUMNS,
    answer: str | None = None,
) -> tuple[int, str, str]:
    """``(exit code, piped stdout, terminal text)``: stderr (and stdout with ``stdout_too``) on a
    ``columns``-wide pseudo-terminal. The terminal turns ``\\n`` into ``\\r\\n``; the text is
    given back with plain ``\\n``. With ``answer``, stdin is the terminal too and ``answer`` is
    typed into it, for a command that asks."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, columns, 0, 0))
    process = subprocess.Popen(
        [memstore_executable(), *args],
        # Rich asks stdin for the terminal size first: not the runner's
        stdin=subprocess.DEVNULL if answer is None else terminal,
        stdout=terminal if stdout_too else subprocess.PIPE,
        stderr=terminal,
        env={**env, "COLUMNS": str(columns), "LINES": str(ROWS)},
        text=True,
    )
    os.close(terminal)
    if answer is not None:
        os.write(controller, answer.encode())
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal closed with the process
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    stdout, _ = process.communicate()
    reader.join(10)
    os.close(controller)
    text = b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")
    return process.returncode, stdout or "", text
