"""`presets`: the built-in writing presets as JSON."""

from __future__ import annotations

import argparse

from tokenswift.cli.common import CliError


def add_command(sub) -> None:
    """presets"""
    presets = sub.add_parser("presets", help="the built-in writing presets as JSON (save one to use with --preset)")
    presets.add_argument("name", nargs="?", default=None,
                         help="print this preset alone, e.g. \"Creative (XTC)\" (default: all of them, by name)")
    presets.set_defaults(func=cmd_presets)


def cmd_presets(args: argparse.Namespace) -> int:
    from tokenswift.text.writing_presets import built_in, preset_json

    presets = built_in()
    if args.name is not None and args.name not in presets:
        raise CliError(f"name: no built-in preset {args.name!r}; choose from {', '.join(map(repr, presets))}")
    print(preset_json(presets if args.name is None else presets[args.name]), end="")
    return 0
