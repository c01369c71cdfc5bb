"""Where the app keeps its files: $TOKENSWIFT_HOME, else ~/.local/share/tokenswift-studio.

The store's SQLite file and the GGUF models the app has converted (handed to the engine as its cache directory)
live there, so backing up or moving the studio is one folder."""

from __future__ import annotations

import os
from pathlib import Path


def data_home() -> Path:
    return Path(os.environ.get("TOKENSWIFT_HOME") or Path.home() / ".local" / "share" / "tokenswift-studio")


def gguf_cache() -> Path:
    """The cache directory the app gives the engine for converted GGUF files (`load_model(cache_dir=...)`)."""
    return data_home() / "gguf-cache"
