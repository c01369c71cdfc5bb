"""The app's one folder for Library exports: each export in its own subfolder (so the file keeps its plain
name), exports older than an hour removed at the next one, and the whole folder removed at shutdown."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

KEEP_S = 3600.0  # Gradio copies the file into its own cache when it sends it; ours is only the source


class Exports:
    def __init__(self, parent: str | Path | None = None, keep_s: float = KEEP_S):
        self.folder = Path(tempfile.mkdtemp(prefix="tokenswift-exports-", dir=parent))
        self.keep_s = keep_s

    def write(self, filename: str, data: bytes) -> Path:
        self.prune()
        path = Path(tempfile.mkdtemp(dir=self.folder)) / filename
        path.write_bytes(data)
        return path

    def prune(self) -> None:
        cutoff = time.time() - self.keep_s
        for sub in self.folder.iterdir():
            if sub.stat().st_mtime < cutoff:
                shutil.rmtree(sub, ignore_errors=True)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
