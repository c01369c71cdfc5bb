"""`generate`: text streamed to stdout, plain decoding or TokenSwift."""

from __future__ import annotations

import argparse
import sys

from tokenswift.cli.common import (
    check_lengths,
    cli_draft_context,
    engine_options,
    note,
    open_model,
    read_bans,
    read_prompt,
    read_world_info,
    settings_from,
    speculation_from,
    write_json,
)
from tokenswift.cli.flags import (
    GivenSwitch,
    add_ban_args,
    add_draft_model_arg,
    add_fast_args,
    add_instruction_arg,
    add_model_args,
    add_prompt_args,
    add_sampler_args,
    add_world_info_arg,
)
from tokenswift.settings import DraftSettings, writing_settings


def add_command(sub) -> None:
    """generate"""
    gen = sub.add_parser("generate", help="generate text, streamed to stdout")
    add_model_args(gen)
    add_draft_model_arg(gen)
    add_prompt_args(gen)
    add_sampler_args(gen)
    gen.add_argument("--mode", default="tokenswift",
                     help="tokenswift (speculative decoding: faster where its guesses are right) or ar (plain "
                          "decoding); both write the same text (default: %(default)s)")
    gen.add_argument("--ignore-eos", action="store_true",
                     help="with --no-ban-eos: keep writing past the model's end of text, as the paper's "
                          "fixed-length runs do (default: off)")
    gen.add_argument("--stop", action="append", default=[],
                     help="stop when this text appears; repeat for several (default: none)")
    gen.add_argument("--ban-eos", action=GivenSwitch, default=writing_settings().ban_eos,
                     help="never let the model end the text, so the draft reaches its length; --no-ban-eos stops "
                          "where the model ends it (default: on, as in the app)")
    add_ban_args(gen)
    add_instruction_arg(gen)
    add_world_info_arg(gen)
    add_fast_args(gen)
    gen.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    # Check everything cheap before importing torch and loading a model that may take minutes.
    settings = settings_from(args, ignore_eos=args.ignore_eos, ban_eos=args.ban_eos, stop=tuple(args.stop),
                             prompt_format=args.prompt_format, ban=read_bans(args))
    spec = speculation_from(args, mode=args.mode)
    text = read_prompt(args)
    world = read_world_info(args)
    from tokenswift.decode.generate import Generator

    lm = open_model(args)
    options = engine_options(args, lm, spec)
    prompt_ids, pinned = cli_draft_context(lm, text, settings.prompt_format, world=world)
    check_lengths(lm, settings, prompt_ids, pinned, spec)
    gen = Generator(lm, settings, prompt_ids, options=options, pinned=pinned)
    streamed, finish = stream(gen, lm.tokenizer, prompt_ids)
    metrics = gen.metrics().to_dict()
    write_json(args.json_out, {
        "prompt_tokens": len(prompt_ids), "tokens": gen.produced, "text": streamed, "metrics": metrics,
        "finish_reason": finish, "model": lm.name, "device": str(lm.device),
        "dtype": lm.precision, "settings": DraftSettings(settings, spec).values(),
    })
    summary = f"[{len(gen.produced)} tokens, {metrics['tokens_per_s']:.1f} tokens/s, {finish}"
    if spec.mode == "tokenswift":
        summary += f", alpha {metrics['alpha']:.2f}, {metrics['tokens_per_step']:.2f} tokens/step"
    note(summary + "]")
    return 0


def stream(gen, tokenizer, prompt_ids: list[int]) -> tuple[str, str | None]:
    """Write the text to stdout as it is produced; returns exactly what was written and why it ended."""
    from tokenswift.text.detok import IncrementalDetokenizer

    # The prompt is the detokenizer's context, so the first token's leading space comes out right.
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    pieces, finish = [], None
    for event in gen.steps():
        pieces.append(detok.push(event.tokens))
        sys.stdout.write(pieces[-1])
        sys.stdout.flush()
        finish = event.finish_reason
    sys.stdout.write("\n")
    sys.stdout.flush()
    return "".join(pieces), finish
