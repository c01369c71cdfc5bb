"""Is a process on this host still alive? Used to requeue the job of a worker that died."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int | None) -> bool:
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """A killed child that its parent has not reaped yet still answers kill(pid, 0)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        # The state follows the parenthesised command name, which may itself contain spaces.
        return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
