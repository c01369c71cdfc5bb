"""A gate that holds a real worker process mid-job, so a test can pause, stop or kill -9 it at a point it has
observed rather than at a moment it guessed: a free-running worker could finish the whole job between the test
seeing its second chunk and the kill (a stalled machine did), and the test then proved nothing or failed.

The test writes `hold` (a token count) into the gate folder; the worker, after each committed chunk that does not
end the job, once its job has that many tokens stored, renames `hold` to `held` and waits while `held` exists. The
test waits for `held`, then kills the worker (which stays held) or deletes `held` to let it go on. A worker holds at
most once per `hold` written, so a successor started with the same gate runs freely.

The worker side patches the store's progress verb in the worker's own process only (`python -c` with main(), or
run_worker() as a spawned process's target): the product code is the same as the app runs.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


class Gate:
    """The test's side."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def hold_at(self, tokens: int) -> None:
        """The worker holds after its first non-final commit that leaves its job with >= tokens stored."""
        assert not (self.folder / "held").exists(), "release the held worker first"
        staged = self.folder / "hold.tmp"
        staged.write_text(str(tokens))
        staged.rename(self.folder / "hold")  # atomic: the worker never reads half a number

    def held(self) -> bool:
        return (self.folder / "held").exists()

    def release(self) -> None:
        (self.folder / "held").unlink()


def install(folder: Path) -> None:
    """The worker's side: wrap RunVerbs.append_progress (the one verb that commits a job's chunks)."""
    from storage.runs import RunVerbs

    commit = RunVerbs.append_progress
    hold, held = folder / "hold", folder / "held"

    def append_progress(self, gen_id, owner, progress, *, finish=None, finish_reason=None):
        kept = commit(self, gen_id, owner, progress, finish=finish, finish_reason=finish_reason)
        if kept and finish is None and hold.exists():
            stored = self.get_generation(gen_id, with_text=False).produced_tokens
            if stored >= int(hold.read_text()):
                hold.rename(held)
                while held.exists():  # the heartbeat thread goes on meanwhile: the job stays this worker's
                    time.sleep(0.01)
        return kept

    RunVerbs.append_progress = append_progress


def run_worker(config, folder: Path) -> None:
    """A spawned process's target (as app.py starts its worker), gated."""
    install(folder)
    from worker.loop import run_worker as run

    run(config)


def gated_command(folder: Path, host: str | None = None) -> tuple[str, ...]:
    """The arguments after `python` that run `python -m worker ARGS...` gated (Workers.start's `python`); with
    `host`, on "another machine" as far as the store can tell (socket.gethostname says `host`)."""
    tests = str(Path(__file__).resolve().parent)
    run = f"import sys; sys.path.insert(0, {tests!r}); import worker_gate; worker_gate.main()"
    return ("-c", run, str(folder), host or "")


def main() -> None:
    folder, host, args = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    install(folder)
    if host:
        import socket

        socket.gethostname = lambda: host
    import runpy

    sys.argv = ["worker", *args]
    runpy.run_module("worker", run_name="__main__", alter_sys=True)
