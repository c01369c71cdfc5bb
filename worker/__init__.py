"""The generation worker: owns the model, runs jobs from the store. Start it with `python -m worker` or,
from app.py, `multiprocessing.get_context("spawn").Process(target=run_worker, args=(WorkerConfig(...),))`."""

from worker.config import WorkerConfig
from worker.loop import run_worker

__all__ = ["WorkerConfig", "run_worker"]
