"""Shared fixtures. Tests that need ../shared skip with a clear reason when it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The models under test are tiny: intra-op threads only add contention on a 2-core machine.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
STORIES = SHARED / "models" / "stories260k"
BOOKS = SHARED / "data" / "books"


def need_shared(path: Path = STORIES) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is absent: these tests need the read-only ../shared folder beside the repo")
    return path


@pytest.fixture(scope="session")
def stories_path() -> Path:
    return need_shared(STORIES)


@pytest.fixture(scope="session")
def stories64(stories_path):
    """stories260k in float64 on CPU: the exactness tests' model (design §3)."""
    from tokenswift.loading import load_model

    return load_model(str(stories_path), device="cpu", dtype="float64")


@pytest.fixture(scope="session")
def stories32(stories_path):
    from tokenswift.loading import load_model

    return load_model(str(stories_path), device="cpu", dtype="float32")
