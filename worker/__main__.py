"""python -m worker --db URL [--model M] [--heads DIR] [--device cpu|cuda] [--dtype ...] [--once]"""

from __future__ import annotations

import argparse

from tokenswift.settings import threads_problem
from worker.config import WorkerConfig
from worker.loop import run_worker


def parse_args(argv: list[str] | None = None) -> WorkerConfig:
    defaults = WorkerConfig()
    p = argparse.ArgumentParser(prog="python -m worker", description="TokenSwift Studio generation worker")
    p.add_argument("--db", help="SQLAlchemy URL of the store, e.g. postgresql+psycopg://user:password@host/db for "
                   "workers on several machines (default: the app's SQLite file)")
    p.add_argument("--model", help="checkpoint directory, .gguf file or hub id to load at start (default: the "
                                   "model chosen in the app's Model tab)")
    p.add_argument("--heads", help="draft-heads directory, if not inside the checkpoint")
    p.add_argument("--device", default=defaults.device, help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", help="float32, float64 (CPU), bfloat16, float16, q4 (a GGUF file's quantized weights, "
                                  "CPU) (default: on a GPU float32 up to 500M parameters, else bfloat16; on the "
                                  "CPU q4 for a Q4_0/Q4_1/Q8_0 or K-quant GGUF, else float32)")
    p.add_argument("--worker-id", default=defaults.worker_id, help="row in the workers table (default: host:pid)")
    p.add_argument("--once", action="store_true", help="exit when the queue is empty")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--fixed-batch", action="store_true",
                   help="verify the configured candidate batch every iteration (the paper's loop) instead of "
                        "adapting it to the measured costs; the text is the same either way")
    p.add_argument("--no-fast", action="store_true",
                   help="on a CUDA device, run the eager passes instead of the fast path's CUDA graphs "
                        "(default: graphs; the text is the same)")
    p.add_argument("--poll-s", type=float, default=defaults.poll_s, help="idle wait between queue looks")
    p.add_argument("--lease-s", type=float, default=defaults.lease_s,
                   help="requeue a job whose worker on another host is silent this long")
    p.add_argument("--flush-s", type=float, default=defaults.flush_s, help="persist at least this often")
    p.add_argument("--flush-tokens", type=int, default=defaults.flush_tokens,
                   help="... or when this many tokens are pending")
    p.add_argument("--store-retry-s", type=float, default=defaults.store_retry_s,
                   help="while the store refuses writes (a full disk, a database restart), try again this often")
    args = p.parse_args(argv)
    if problem := threads_problem(args.threads):
        p.error(problem)
    return WorkerConfig(
        db=args.db, model=args.model, heads=args.heads, device=args.device, dtype=args.dtype,
        worker_id=args.worker_id, once=args.once, threads=args.threads, adaptive=not args.fixed_batch,
        fast=not args.no_fast, poll_s=args.poll_s,
        lease_s=args.lease_s, flush_s=args.flush_s, flush_tokens=args.flush_tokens,
        store_retry_s=args.store_retry_s,
    )


if __name__ == "__main__":
    run_worker(parse_args())
