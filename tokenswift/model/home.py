"""Where the app keeps its files: $TOKENSWIFT_HOME, else ~/.local/share/tokenswift-studio.

The store's SQLite file and the engine's caches (converted GGUF models) live there, so backing up or moving
the studio is one folder."""

from __future__ import annotations

import os
from pathlib import Path


def data_home() -> Path:
    return Path(os.environ.get("TOKENSWIFT_HOME") or Path.home() / ".local" / "share" / "tokenswift-studio")
