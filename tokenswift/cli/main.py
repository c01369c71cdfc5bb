"""The command line: `python -m tokenswift generate | bench | bench-ar | bench-bound | bench-shift | bench-gpu |
presets | train-heads | eval-heads | import-heads | draft-data | train-draft`: the parser's wiring and dispatch.
Each command's flags and checks live in this package, one module per command or family (generate.py, bench.py,
bench_gpu.py, presets.py, train.py); what they share in common.py and flags.py.

Other tools rely on the flag names, the JSON keys and the exit codes: bad input exits with 2 and one
`error: ...` line on stderr, never a traceback. The benchmark logic lives in
tokenswift/bench/.
"""

from __future__ import annotations

import argparse
import os
import sys

from tokenswift.cli import bench, bench_gpu, generate, presets, train
from tokenswift.cli.common import USAGE_ERROR, CliError, Parser, note


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m tokenswift", description="TokenSwift: lossless speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    generate.add_command(sub)
    bench.add_commands(sub)
    bench_gpu.add_command(sub)
    presets.add_command(sub)
    train.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, or a usage error already printed as one line
        return done.code if isinstance(done.code, int) else USAGE_ERROR
    try:
        return args.func(args)
    except CliError as error:
        sys.stdout.flush()
        note(f"error: {error}")
        return USAGE_ERROR
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python from complaining at exit.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives until the process exits
        return 1
    except KeyboardInterrupt:
        sys.stdout.flush()
        note("interrupted")
        return 130
