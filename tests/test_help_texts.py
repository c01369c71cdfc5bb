"""Every flag of the app and of `python -m tokenswift generate` says what it does and its default."""

from __future__ import annotations

import argparse
import contextlib
import io
import re

import pytest

# The default stated as a clause of its own ("(default: 1024)", "...; default <model>/heads"), not the word in
# passing ("the default model").
DEFAULT = re.compile(r"(\(|; |\. )default\b|\bdefault:")


def flags_help(help_text: str) -> dict[str, str]:
    """--flag -> the help text printed beside it."""
    entries = re.split(r"\n  (?=-)", help_text.split("options:", 1)[1])
    return {re.match(r"(?:-\w, )?(--[\w-]+)", e).group(1): " ".join(e.split()) for e in entries if "--" in e}


def test_every_app_flag_has_help_with_its_default():
    import app

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        app.parse_args(["--help"])
    flags = flags_help(out.getvalue())
    assert {"--port", "--threads", "--inbrowser", "--db"} <= set(flags)
    assert [f for f, text in flags.items() if f != "--help" and not DEFAULT.search(text)] == []
    assert "~/.local/share/tokenswift-studio/studio.db" in flags["--db"]


def test_every_engine_flag_has_help_with_its_default():
    from tokenswift.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    prompts = ("prompt", "prompt_file", "prompt_book")  # one of them is required: no default to state
    missing = [f"{name} {a.option_strings[0]}" for name, parser in sub.choices.items() for a in parser._actions
               if a.option_strings and a.dest != "help" and not a.required and a.dest not in prompts
               and not DEFAULT.search(a.help or "")]
    assert missing == []
    budget = next(a for a in sub.choices["generate"]._actions if a.dest == "budget")
    assert "|B|" not in budget.help and "tokens of the story" in budget.help
