"""`bench`, `bench-ar`, `bench-bound` and `bench-shift`: flags, checks and printed tables (the runs themselves:
tokenswift/bench/)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

from tokenswift.cli.common import (
    CliError,
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
    add_ban_args,
    add_draft_model_arg,
    add_fast_args,
    add_instruction_arg,
    add_model_args,
    add_prompt_args,
    add_sampler_args,
    add_world_info_arg,
    int_list_arg,
)
from tokenswift.settings import lone_surrogate

if TYPE_CHECKING:
    from tokenswift.model.loading import LoadedModel

BOOKS_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "books"  # ../shared beside the repo

def add_commands(sub) -> None:
    """bench, bench-ar, bench-bound and bench-shift"""
    cmp = sub.add_parser("bench", help="AR versus TokenSwift on one prompt, in one process")
    add_model_args(cmp)
    add_draft_model_arg(cmp)
    add_prompt_args(cmp, books=True)
    add_sampler_args(cmp)
    cmp.add_argument("--warmup-tokens", type=int, default=16,
                     help="short run of each mode before timing (default: %(default)s)")
    cmp.add_argument("--slice-tokens", type=int, default=128,
                     help="AR and TokenSwift take turns of this many tokens, so changing machine load hits both "
                          "alike (default: %(default)s)")
    cmp.add_argument("--window-tokens", type=int, default=2048,
                     help="a run longer than this many new tokens is also shown per window of them (a multiple of "
                          "--slice-tokens): speed-up, acceptance, n-gram share, distinct-4 (default: %(default)s)")
    add_ban_args(cmp)
    add_world_info_arg(cmp)
    add_fast_args(cmp)
    cmp.set_defaults(func=cmd_bench)

    ar = sub.add_parser("bench-ar", help="plain AR tokens/s at several context lengths")
    add_model_args(ar, heads=False)
    ar.add_argument("--contexts", type=int_list_arg, default=[256, 1024, 4096],
                    help="context lengths to time, comma-separated (default: 256,1024,4096)")
    ar.add_argument("--steps", type=int, default=64,
                    help="timed steps per context, the contexts taking turns in 8 rounds (default: %(default)s)")
    ar.add_argument("--warmup", type=int, default=4, help="untimed steps first (default: %(default)s)")
    ar.add_argument("--temperature", type=float, default=0.0,
                    help="sampling temperature; 0 = greedy, as scripts/bench_llamacpp.py (default: %(default)s)")
    ar.set_defaults(func=cmd_bench_ar)

    bound = sub.add_parser("bench-bound", help="the most TokenSwift can gain here: each candidate shape's accepted "
                                               "tokens times its verify pass's cost in plain steps")
    add_model_args(bound)
    add_prompt_args(bound, books=True)
    add_sampler_args(bound)
    bound.add_argument("--contexts", type=int_list_arg, default=None,
                       help="contexts at which to time the passes (default: the prompt's length and the length "
                            "after max-new-tokens)")
    bound.add_argument("--repeats", type=int, default=15,
                       help="timed rounds per context; the median is kept (default: %(default)s)")
    bound.set_defaults(func=cmd_bench_bound)

    shift = sub.add_parser("bench-shift", help="a draft past the model's context: AR versus TokenSwift with "
                                              "context shifting, and the time spent on shifts")
    add_model_args(shift)
    add_prompt_args(shift, books=True)
    add_sampler_args(shift)
    shift.add_argument("--memory", default="", help="Memory text pinned at the top of every window (default: none)")
    shift.add_argument("--authors-note", default="",
                       help="Author's Note inserted near the end of every window (default: none)")
    add_instruction_arg(shift)
    shift.add_argument("--warmup-tokens", type=int, default=16,
                       help="short run of each mode before timing (default: %(default)s)")
    shift.add_argument("--slice-tokens", type=int, default=256,
                       help="the modes take turns of this many tokens, so that a machine whose speed drifts over "
                            "a long draft slows both alike (default: %(default)s)")
    add_fast_args(shift)
    shift.set_defaults(func=cmd_bench_shift)


def bench_prompt_text(args: argparse.Namespace) -> str:
    """The prompt text: --prompt, --prompt-file, or a whole book from --prompt-book (cut to tokens later)."""
    if args.prompt_book is None:
        return read_prompt(args)
    from tokenswift.bench.runs import BenchError, book_text

    split, _, index = args.prompt_book.partition(":")
    if not split or not index.isdigit():
        raise CliError(f"prompt-book: expected SPLIT:N such as eval:0, got {args.prompt_book!r}")
    if args.prompt_tokens < 1:
        raise CliError("prompt-tokens: must be >= 1")
    books = Path(args.books) if args.books else BOOKS_DIR / f"{split}.jsonl.xz"
    try:
        text = book_text(books, int(index))
    except BenchError as error:
        raise CliError(f"prompt-book: {error}") from None
    if not text.strip():
        raise CliError(f"prompt-book: book {args.prompt_book} is empty")
    return text


def bench_prompt_ids(args: argparse.Namespace, lm: LoadedModel, text: str) -> list[int]:
    """A book's opening cut to --prompt-tokens (bench_prompt_text read it), or the given prompt whole."""
    from tokenswift.bench.runs import leading_tokens

    return leading_tokens(lm, text, args.prompt_tokens) if args.prompt_book else lm.encode(text)


def cmd_bench(args: argparse.Namespace) -> int:
    settings = settings_from(args, ignore_eos=True, ban=read_bans(args))
    spec = speculation_from(args)
    text = bench_prompt_text(args)  # a bad prompt fails before the model loads
    world = read_world_info(args)
    if args.slice_tokens < 1:
        raise CliError("slice-tokens: must be >= 1")
    if args.window_tokens < args.slice_tokens or args.window_tokens % args.slice_tokens:
        raise CliError(f"window-tokens: must be a multiple of --slice-tokens ({args.slice_tokens})")
    from tokenswift.bench.runs import compare
    from tokenswift.draft.choice import drafter_for
    from tokenswift.text.context_window import pinned_ids

    lm = open_model(args)
    options = engine_options(args, lm, spec)
    prompt_ids = bench_prompt_ids(args, lm, text)
    pinned = pinned_ids(lm, "", "", world=world) if world is not None else None
    check_lengths(lm, settings, prompt_ids, pinned, spec)
    drafter = drafter_for(lm, spec)
    if lm.heads is None and drafter not in ("layer", "model"):
        note("note: no draft heads: TokenSwift drafts with the base head and n-grams only")
    result = compare(lm, prompt_ids, settings, warmup_tokens=args.warmup_tokens, slice_tokens=args.slice_tokens,
                     options=options, pinned=pinned, window_tokens=args.window_tokens)
    print_bench(result)
    write_json(args.json_out, result)
    return 0


def print_bench(r: dict) -> None:
    print(f"{r['model']} on {r['device']} ({r['dtype']}), prompt {r['prompt_tokens']} tokens, "
          f"{r['new_tokens']} new tokens")
    print(f"{'mode':<12}{'tokens/s':>12}{'elapsed s':>12}")
    print(f"{'ar':<12}{r['ar_tokens_per_s']:>12.1f}{r['ar_elapsed_s']:>12.3f}")
    print(f"{'tokenswift':<12}{r['ts_tokens_per_s']:>12.1f}{r['ts_elapsed_s']:>12.3f}")
    same = "yes" if r["identical"] else f"no (first divergence at {r['first_divergence']})"
    print(f"speed-up {r['speedup']:.2f}x (median of {len(r['slices'])} alternating slices of {r['slice_tokens']} "
          f"tokens; min {r['speedup_min']:.2f}x, max {r['speedup_max']:.2f}x; whole run {r['speedup_overall']:.2f}x) "
          f"| identical: {same}")
    print(f"drafter {r['drafter']}{' (adaptive)' if r['adaptive'] else ''}")
    print(f"alpha {r['alpha']:.3f} | beta {r['beta']:.3f} | tokens/step {r['tokens_per_step']:.2f} | "
          f"distinct {' '.join(f'{d:.3f}' for d in r['distinct'])}")
    print(f"draft {r['draft_s']:.3f} s | verify {r['verify_s']:.3f} s | overhead {r['overhead_s']:.3f} s "
          f"({100 * r['overhead_share']:.1f}%)")
    if r["plain_steps"]:
        print(f"plain steps (adaptive: where AR was faster, and to time it while drafting) {r['plain_steps']} of "
              f"{r['steps'] + r['plain_steps']} iterations ({100 * r['plain_share']:.1f}%)")
    _print_pass_costs(r["pass_costs"])
    if len(r["windows"]) > 1:
        _print_windows(r["windows"])


def _print_pass_costs(costs: dict) -> None:
    if not costs:
        return
    plain = costs["plain_step_s"]
    print(f"{'shape':<16}{'rows':>6}{'ms/iter':>10}{'x plain':>9}{'tokens/iter':>13}{'tokens/s':>10}")
    for c in costs["shapes"]:
        ms = f"{1e3 * c['seconds']:.1f}" if c["seconds"] else "-"
        rel = f"{c['seconds'] / plain:.2f}" if c["seconds"] and plain else "-"
        tok = f"{c['tokens']:.2f}" if c["tokens"] else "-"
        rate = f"{c['tokens_per_s']:.1f}" if c["tokens_per_s"] else "-"
        print(f"{c['shape']:<16}{c['rows']:>6}{ms:>10}{rel:>9}{tok:>13}{rate:>10}")
    if plain:
        print(f"{'plain step':<16}{1:>6}{1e3 * plain:>10.1f}{1:>9.2f}{1:>13.2f}{1 / plain:>10.1f}")


def _print_windows(windows: list[dict]) -> None:
    print(f"{'new tokens':<14}{'AR tok/s':>9}{'TS tok/s':>9}{'speed-up':>9}{'alpha':>7}{'tok/step':>9}"
          f"{'n-gram':>8}{'plain':>7}{'dist-4':>8}")
    for w in windows:
        print(f"{w['start']:>6}-{w['end']:<7}{w['ar_tokens_per_s']:>9.1f}{w['ts_tokens_per_s']:>9.1f}"
              f"{w['speedup']:>8.2f}x{w['alpha']:>7.3f}{w['tokens_per_step']:>9.2f}"
              f"{100 * w['ngram_share']:>7.0f}%{100 * w['plain_share']:>6.0f}%{w['distinct4']:>8.3f}")


def cmd_bench_ar(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.warmup < 0:
        raise CliError("steps: must be >= 1 (and --warmup >= 0)")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise CliError("temperature: must be >= 0")
    args.heads = "none"  # AR reads no heads: do not load them
    lm = open_model(args)
    from tokenswift.bench.runs import bench_ar

    result = bench_ar(lm, args.contexts, steps=args.steps, warmup=args.warmup, temperature=args.temperature)
    print_bench_ar(result)
    write_json(args.json_out, result)
    return 0


def print_bench_ar(r: dict) -> None:
    sampling = "greedy" if r["temperature"] == 0 else f"temperature {r['temperature']:g}"
    print(f"{r['model']} on {r['device']} ({r['dtype']}), {sampling}, {r['steps']} timed steps per context")
    cuda = r["copy_bandwidth_gb_s"] is not None
    first = next((row["context"] for row in r["rows"] if "skipped" not in row), None)
    header = f"{'context':>8}{'tokens/s':>12}{'ms/token':>12}" + (f"{f'x {first}':>10}" if first is not None else "")
    print(header + (f"{'GB/s':>10}{'of copy':>10}" if cuda else ""))
    for row in r["rows"]:
        if "skipped" in row:
            print(f"{row['context']:>8}  skipped: {row['skipped']}")
            continue
        line = f"{row['context']:>8}{row['tokens_per_s']:>12.1f}{row['step_ms']:>12.3f}{row['vs_first']:>9.3f}x"
        if cuda:
            line += f"{row['bandwidth_gb_s']:>10.1f}{100 * row['bandwidth_fraction']:>9.1f}%"
        print(line)
    if first is not None:
        print(f"(contexts timed in turns; x {first}: the median over rounds of a context's speed over {first}'s)")
    if cuda:
        print(f"measured device copy bandwidth: {r['copy_bandwidth_gb_s']:.1f} GB/s")


def cmd_bench_bound(args: argparse.Namespace) -> int:
    settings = settings_from(args, ignore_eos=True)
    spec = speculation_from(args)
    text = bench_prompt_text(args)
    if args.repeats < 1:
        raise CliError("repeats: must be >= 1")
    from tokenswift.bench.bound import bench_bound, print_bench_bound
    from tokenswift.settings import max_nodes

    lm = open_model(args)
    prompt_ids = bench_prompt_ids(args, lm, text)
    check_lengths(lm, settings, prompt_ids, spec=spec)
    contexts = args.contexts or [len(prompt_ids), len(prompt_ids) + settings.max_new_tokens]
    rows = max_nodes(spec.tree, spec.ngram_topk)
    if any(c < 1 or c + rows > lm.max_context for c in contexts):
        raise CliError(f"contexts: each must be >= 1 and leave {rows} candidate rows within the model's context "
                       f"of {lm.max_context} tokens, got {contexts}")
    result = bench_bound(lm, prompt_ids, settings, contexts, repeats=args.repeats, spec=spec)
    print_bench_bound(result)
    write_json(args.json_out, result)
    return 0


def cmd_bench_shift(args: argparse.Namespace) -> int:
    settings = settings_from(args, ignore_eos=True, context_shift=True, prompt_format=args.prompt_format)
    spec = speculation_from(args)
    text = bench_prompt_text(args)
    for flag, value in (("--memory", args.memory), ("--authors-note", args.authors_note)):
        if (at := lone_surrogate(value)) is not None:
            raise CliError(f"{flag}: is not valid UTF-8 (an undecodable byte at character {at})")
    if args.prompt_format == "instruction" and args.prompt_book:
        raise CliError("instruction: give the instruction with --prompt or --prompt-file, not a book")
    if args.slice_tokens < 1:
        raise CliError("slice-tokens: must be >= 1")
    from tokenswift.bench.shift import bench_shift, print_bench_shift
    from tokenswift.text.context_window import pinned_ids

    lm = open_model(args)
    options = engine_options(args, lm, spec)
    if args.prompt_book:
        prompt_ids, pinned = bench_prompt_ids(args, lm, text), pinned_ids(lm, args.memory, args.authors_note)
    else:
        prompt_ids, pinned = cli_draft_context(lm, text, settings.prompt_format, args.memory, args.authors_note)
    check_lengths(lm, settings, prompt_ids, pinned, spec)
    result = bench_shift(lm, prompt_ids, settings, pinned, warmup_tokens=args.warmup_tokens, options=options,
                         slice_tokens=args.slice_tokens)
    print_bench_shift(result)
    write_json(args.json_out, result)
    return 0
