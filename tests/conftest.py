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
    from tokenswift.model.loading import load_model

    return load_model(str(stories_path), device="cpu", dtype="float64")


@pytest.fixture(scope="session")
def stories32(stories_path):
    from tokenswift.model.loading import load_model

    return load_model(str(stories_path), device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def pg_cluster():
    """One PostgreSQL server for the whole run (tests/pg_cluster.py); skipped where Debian's binaries are absent."""
    from pg_cluster import Cluster, find_bin_dir

    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL's initdb/pg_ctl are absent: install Debian's postgresql package (.ci/run does)")
    cluster = Cluster(bin_dir).init()
    try:
        cluster.migrate_template()
        yield cluster
    finally:
        cluster.destroy()


BACKENDS = ["sqlite", "postgresql"]


def backend_url(request, tmp_path: Path, *, migrated: bool):
    """A SQLite file, or a fresh database on the test server (a copy of the migrated template, or empty)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'studio.db'}"
        return
    cluster = request.getfixturevalue("pg_cluster")
    url = cluster.new_database(migrated)
    yield url
    cluster.drop_database(url)


@pytest.fixture(params=BACKENDS)
def db_url(request, tmp_path):
    """The store's URL on each backend, already migrated (for SQLite: open_store migrates the new file)."""
    yield from backend_url(request, tmp_path, migrated=True)


@pytest.fixture(params=BACKENDS)
def blank_db_url(request, tmp_path):
    """An empty database on each backend, for the migration tests."""
    yield from backend_url(request, tmp_path, migrated=False)


def only_sqlite(test):
    """For what only a SQLite file has (PRAGMAs, a read-only or full file)."""
    return pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)(test)


def only_postgresql(test):
    """For what only a database server does (go down and come back)."""
    return pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)(test)
