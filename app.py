"""TokenSwift Studio: `python app.py [--listen] [--port 7860] [--model DIR|org/name] [--auth user:pass]`.

Opens the store (migrating it), spawns the generation worker, and serves the UI at / and the REST API at
/api on one server. Flags follow text-generation-webui's where they overlap.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import webbrowser
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
BUNDLED_MODEL = Path(__file__).resolve().parent / "models" / "tswift-books"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="TokenSwift Studio: novel-length drafts with a local LLM")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--listen", action="store_true", help="bind 0.0.0.0 (reachable from the network)")
    p.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    p.add_argument("--auth", help="user:pass[,user2:pass2] for the UI and the API")
    p.add_argument("--auth-file", help="file with user:pass entries, one per line")
    p.add_argument("--db", help="SQLAlchemy URL of the store (default: the app's SQLite file)")
    p.add_argument("--model", help=f"checkpoint directory or hub id (default: the bundled {BUNDLED_MODEL.name})")
    p.add_argument("--heads", help="draft-heads directory, if not <model>/heads")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16, float16, float64")
    p.add_argument("--threads", type=int, help="torch CPU threads for the worker")
    p.add_argument("--fixed-batch", action="store_true",
                   help="the worker verifies the configured candidate batch every iteration, never adapting it")
    p.add_argument("--inbrowser", action="store_true", help="open the UI in the default browser")
    p.add_argument("--no-worker", action="store_true", help="UI only; a worker runs elsewhere on the same --db")
    args = p.parse_args(argv)
    if args.model is None and BUNDLED_MODEL.is_dir():
        args.model = str(BUNDLED_MODEL)
    from ui.server import parse_credentials

    try:
        args.credentials = parse_credentials(args.auth, args.auth_file)
    except ValueError as error:
        p.error(str(error))
    return args


def spawn_worker(args: argparse.Namespace) -> multiprocessing.Process:
    from worker import WorkerConfig, run_worker

    config = WorkerConfig(db=args.db, model=args.model, heads=args.heads, device=args.device, dtype=args.dtype,
                          threads=args.threads, adaptive=not args.fixed_batch, parent_pid=os.getpid())
    # spawn, not fork: CUDA cannot start in a forked child, and the store's engine must not cross processes.
    process = multiprocessing.get_context("spawn").Process(target=run_worker, args=(config,), name="worker")
    process.start()
    return process


def stop_worker(process: multiprocessing.Process | None) -> None:
    if process is None:
        return
    process.terminate()  # SIGTERM: the worker saves, hands its draft back to the queue, and exits
    process.join(30)
    if process.is_alive():
        process.kill()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import uvicorn

    from storage import open_store
    from ui.server import create_app, share_link

    store = open_store(args.db)
    worker = None if args.no_worker else spawn_worker(args)
    # uvicorn re-raises the signal that stopped it: make it an exception, so the worker is stopped below.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    try:
        app = create_app(store, args.credentials, own_worker=worker is not None)
        host = "0.0.0.0" if args.listen else args.host
        url = f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{args.port}"
        print(f"TokenSwift Studio at {url}  (REST API {url}/api, docs {url}/api/docs)", flush=True)
        if (args.listen or args.share) and not args.credentials:
            print("Warning: reachable by others without a login; add --auth user:pass or --auth-file.", flush=True)
        if args.share:
            threading.Thread(target=share_link, args=(args.port,), daemon=True).start()
        if args.inbrowser:
            threading.Timer(2.0, webbrowser.open, [url]).start()
        uvicorn.run(app, host=host, port=args.port, log_level="warning", timeout_graceful_shutdown=1)
    finally:
        stop_worker(worker)
        store.close()


class Stopped(Exception):
    """SIGTERM or Ctrl+C: the normal way to stop the app."""


def _stop(*_) -> None:
    raise Stopped


if __name__ == "__main__":
    with contextlib.suppress(Stopped):
        main()
    sys.stdout.flush()
    os._exit(0)  # the store is closed and the worker gone: skip seconds of interpreter teardown (gradio, plotly)
