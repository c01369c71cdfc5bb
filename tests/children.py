"""Long-lived processes the tests start (the app with its worker, `python -m worker`) end with the test run on
every exit path: a fixture's own teardown stops them in order, and what a run stopped by -x, Ctrl+C (twice: the
second lands inside the teardown) or an error left behind is killed, with everything it started, when this
process exits.

Each runs in a process group of its own, which it leads: a terminal's Ctrl+C reaches pytest alone (the fixture
stops the app before its worker could be orphaned), and one killpg reaches the app's worker too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import weakref


def start(command: list[str], **popen) -> subprocess.Popen:
    proc = subprocess.Popen(command, process_group=0, **popen)
    # At interpreter exit (atexit), or once the test dropped the Popen. (A group's id is not handed to another
    # process while anyone is left in it.)
    proc.reaper = weakref.finalize(proc, kill_group, proc.pid)
    return proc


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def stop(proc: subprocess.Popen, timeout: float = 10) -> None:
    """Kill what is left of a child's group (its leader, if still running, first) and reap the leader."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout)
    proc.reaper()  # the rest of its group (runs once; later calls do nothing)
