"""What every command shares: the one-line usage error (exit 2), and the steps from flags to settings, prompt,
model and engine options.

torch and the engine are imported inside the commands: importing them takes seconds, and `--help` or a typo in
a flag should answer at once."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tokenswift.settings import (
    TEXT_FIELDS,
    Settings,
    SettingsError,
    Speculation,
    lone_surrogate,
    threads_problem,
    writing_settings,
)
from tokenswift.text.world_info import WorldInfo

if TYPE_CHECKING:
    from tokenswift.model.loading import LoadedModel
    from tokenswift.text.context_window import PinnedText

USAGE_ERROR = 2


class CliError(Exception):
    """Bad input: reported as one `error: ...` line with exit code 2."""


class Parser(argparse.ArgumentParser):
    # argparse prints the whole usage block on a bad flag; the contract is one line on stderr.
    def error(self, message: str):
        self.exit(USAGE_ERROR, f"error: {message} (see {self.prog} --help)\n")


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_json(path: str | None, data: dict) -> None:
    if path is None:
        return
    try:
        Path(path).write_text(json.dumps(data, indent=2) + "\n")
    except OSError as error:
        raise CliError(f"cannot write {path}: {error}") from None


def settings_from(args: argparse.Namespace, **extra) -> Settings:
    """The Settings of the flags: the table's (add_knob), the context flags, then `extra`."""
    knobs = {row.name: getattr(args, row.name) for row in TEXT_FIELDS if row.knob.flag}
    try:
        settings = Settings(seed=args.seed, max_new_tokens=args.max_new_tokens, context_window=args.context_window,
                            shift_step=args.shift_step, **{**knobs, "context_shift": args.context_shift, **extra})
    except SettingsError as error:
        raise CliError(str(error)) from error
    return with_preset(settings, args) if args.preset else settings


def speculation_from(args: argparse.Namespace, **extra) -> Speculation:
    """The speed flags' Speculation (--drafter, --ngram-topk, --tree, --budget, --sinks), then `extra` (the mode)."""
    try:
        return Speculation(ngram_topk=args.ngram_topk, tree=args.tree, budget=args.budget, sinks=args.sinks,
                           drafter=args.drafter, **extra)
    except SettingsError as error:
        raise CliError(str(error)) from error


def with_preset(settings: Settings, args: argparse.Namespace) -> Settings:
    """--preset's values, except where a flag was given on the command line."""
    from tokenswift.text.writing_presets import apply, read_preset

    try:
        preset = read_preset(args.preset)
        given = args.given
        if getattr(args, "ban", None) is not None or getattr(args, "ban_file", None) is not None:
            given = given | {"ban"}  # --ban / --ban-file replace the preset's phrases
        return apply(settings, {key: value for key, value in preset.items() if key not in given})
    except SettingsError as error:
        raise CliError(f"{error} (in {args.preset})") from None


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt text of --prompt or --prompt-file; an empty or blank prompt is an error."""
    if args.prompt is not None:
        text, source = args.prompt, "--prompt"
    else:
        path = Path(args.prompt_file)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CliError(f"prompt file {path} not found") from None
        except (OSError, UnicodeDecodeError) as error:
            raise CliError(f"cannot read prompt file {path}: {error}") from None
        source = f"prompt file {path}"
    if not text.strip():
        raise CliError(f"prompt: {source} is empty")
    if (at := lone_surrogate(text)) is not None:  # bytes that are not UTF-8 reach argv as lone surrogates
        raise CliError(f"prompt: {source} is not valid UTF-8 (an undecodable byte at character {at})")
    return text


def read_bans(args: argparse.Namespace) -> tuple[str, ...]:
    """--ban and --ban-file's phrases; neither given: the writing default."""
    from tokenswift.settings.phrases import read_phrases

    if args.ban is None and args.ban_file is None:
        return writing_settings().ban
    phrases = list(args.ban or ())
    if args.ban_file is not None:
        try:
            phrases += read_phrases(Path(args.ban_file).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CliError(f"--ban-file: {args.ban_file} not found") from None
        except (OSError, UnicodeDecodeError) as error:
            raise CliError(f"--ban-file: cannot read {args.ban_file} as UTF-8 text: {error}") from None
    return tuple(phrases)


def read_world_info(args: argparse.Namespace) -> WorldInfo | None:
    """--world-info's document, or a usage error naming the file and the entry and field at fault."""
    if args.world_info is None:
        return None
    try:
        text = Path(args.world_info).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CliError(f"world-info: cannot read {args.world_info}: {error}") from None
    try:
        return WorldInfo.from_json(text)
    except SettingsError as error:
        raise CliError(f"{error} (in {args.world_info})") from None


def open_model(args: argparse.Namespace) -> LoadedModel:
    import torch

    from tokenswift.model.default_model import default_model_path
    from tokenswift.model.heads import HeadsError
    from tokenswift.model.loading import (
        ModelLoadError,
        compact_cache,
        load_model,
        resolve_device,
        resolve_dtype,
    )
    from tokenswift.model.run_defaults import default_device, default_dtype

    if problem := threads_problem(args.threads):
        raise CliError(problem)
    if args.model is None:
        try:
            args.model = str(default_model_path())
        except ModelLoadError as error:
            raise CliError(str(error)) from None
    device = args.device or default_device()
    try:
        resolve_device(device)
        dtype = args.dtype or default_dtype(device, args.model)
        resolve_dtype(dtype)
    except ValueError as error:
        raise CliError(str(error)) from None
    try:
        lm = load_model(args.model, device=device, dtype=dtype, heads=getattr(args, "heads", None),
                        draft=getattr(args, "draft", None), threads=args.threads)
    except (ModelLoadError, HeadsError) as error:
        raise CliError(str(error)) from None
    try:
        lm = compact_cache(lm, getattr(args, "kv_cache", "auto"))
    except ValueError as error:
        raise CliError(str(error)) from None
    if draft_model := getattr(args, "draft_model", None):
        from tokenswift.draft.model_drafter import attach_draft_model

        try:
            lm = attach_draft_model(lm, draft_model)
        except SettingsError as error:
            raise CliError(str(error)) from None
    if lm.threads is not None:  # one model for the whole process: its thread count is the process's
        torch.set_num_threads(lm.threads)
    return lm


def engine_options(args: argparse.Namespace, lm: LoadedModel, spec: Speculation | None = None):
    """--fast / --adaptive and the speed flags (`spec`; None: TokenSwift's defaults) as the EngineOptions every
    engine of this command runs with."""
    from tokenswift.decode.options import EngineOptions
    from tokenswift.model.fastpath import FastOptions

    fast, lookahead = None, {"auto": None, "on": True, "off": False}[args.lookahead]
    if args.fast:
        if lm.config.sliding_window is not None:
            raise CliError("fast: sliding-window models are not supported by the fast path")
        try:
            fast = FastOptions(attention=args.attention)
        except ValueError as error:
            raise CliError(str(error)) from None
    if fast is not None and lm.device.type == "cuda":  # as the worker: only a path that passed its self-test
        from tokenswift.decode.selftest import choose_path

        fast, choice = choose_path(lm, fast)
        return EngineOptions(fast=fast, adaptive=args.adaptive, choice=choice, speculation=spec or Speculation(),
                             lookahead=lookahead)
    return EngineOptions(fast=fast, adaptive=args.adaptive, speculation=spec or Speculation(), lookahead=lookahead)


def cli_draft_context(lm: LoadedModel, text: str, form: str, memory: str = "", note: str = "",
                      world: WorldInfo | None = None) -> tuple[list[int], PinnedText]:
    """context_window.draft_context, its errors (a model without a chat template) as usage errors."""
    from tokenswift.text.context_window import draft_context

    try:
        return draft_context(lm, text, form, memory, note, world)
    except SettingsError as error:
        raise CliError(str(error)) from None


def check_lengths(lm: LoadedModel, settings: Settings, prompt_ids: list[int],
                  pinned: PinnedText | None = None, spec: Speculation | None = None) -> None:
    """The engine's own checks (prompt not empty, prompt + N within the context, ids in the vocabulary; pinned:
    the window's Memory, note and chat turns fit in it)."""
    from tokenswift.decode.generate import validate

    try:
        validate(lm, settings, prompt_ids, [], pinned, spec)
    except SettingsError as error:
        raise CliError(str(error)) from None
