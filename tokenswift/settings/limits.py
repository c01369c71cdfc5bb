"""The limits every setting is checked against, the error that names a field, and the small checks of text and
threads that the engine, the app and the command line share."""

from __future__ import annotations

import math
from collections.abc import Sequence

MODES = ("tokenswift", "ar")
# The one-pass drafter (fused_drafter.py), the paper's two passes (drafting.py), the draft layer (layer_drafter.py),
# a draft model (model_drafter.py), or auto: the one that is fastest where it runs (draft/choice.py).
DRAFTERS = ("auto", "fused", "paper", "layer", "model")
PROMPT_FORMATS = ("continue", "instruction")  # an opening to continue, or an instruction (the chat template)
KV_CACHES = ("auto", "float32", "bf16", "q8")  # the formats a run's KV cache may keep (model/loading.compact_cache)
INT64_MAX = 2**63 - 1  # the noise is keyed by 64 bits of the seed; the app's store keeps seed and target as int64
NGRAM_LEN = 4  # tokens an n-gram path proposes; every drafter, the engine and the adaptive ladder size batches by it
# Positions past the context the RoPE table holds: a verify batch's candidate rows sit at the last token's
# position + depth, and the cache keeps spare slots; trees and n-gram counts with more rows are refused.
ROPE_SLACK = 1024
MAX_THREADS = 256  # a model's CPU threads (not a setting of the text): far past any core count, and below the
# count at which the tokenizer's thread pool fails to start
CAPACITY_SPARE = 8  # cache slots beyond the longest text and one verify batch
REPEAT_RANGE = 4096  # the no-repeat rule looks back over this many tokens (a few pages): the scan costs about
# 0.1 ms a row per 1,000 tokens (sampling/no_repeat.py)
MAX_WINDOW = 1 << 17  # penalty_window, in tokens: past a novel's length it adds nothing but memory


class SettingsError(ValueError):
    """A setting is out of range; the message names the field."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field, self.reason = field_name, message


def max_nodes(widths: Sequence[int], ngram_topk: int, ngram_len: int = NGRAM_LEN) -> int:
    """Upper bound on the node count for tree `widths` plus `ngram_topk` paths of <= `ngram_len` tokens.

    A path may differ from the tree already at depth 1, so it can add all of its `ngram_len` tokens.
    """
    tree = sum(math.prod(widths[: i + 1]) for i in range(len(widths)))
    return 1 + tree + ngram_topk * ngram_len


def threads_problem(threads: int | None) -> str | None:
    """Why a model cannot run on this many CPU threads (None: the default count), or None."""
    if threads is None or 1 <= threads <= MAX_THREADS:
        return None
    return f"threads: must be in 1..{MAX_THREADS}, not {threads}"


def lone_surrogate(text: str) -> int | None:
    """Where `text` holds a lone surrogate (JSON's \\ud800 escapes and undecodable command-line bytes carry
    them; such text can be neither tokenized nor stored), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None
