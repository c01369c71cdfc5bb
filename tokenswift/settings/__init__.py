"""Settings: what a draft is written with (Settings: what the text is; Speculation: how fast, never what), and
the limits and rules they are checked against.

The lowest package of the engine: it imports no other tokenswift package, so that every one of them (text,
sampling, model, draft, decode) and every front door (the command line, the worker, the app) may import it, and
the engine's packages import each other in one direction only: settings <- text <- sampling <- model <- draft <-
decode <- bench, train, cli (tests/test_package_layers.py holds them to it).
"""

from tokenswift.settings.limits import (
    CAPACITY_SPARE,
    DRAFTERS,
    INT64_MAX,
    KV_CACHES,
    MAX_THREADS,
    MAX_WINDOW,
    MODES,
    NGRAM_LEN,
    PROMPT_FORMATS,
    REPEAT_RANGE,
    ROPE_SLACK,
    SettingsError,
    lone_surrogate,
    max_nodes,
    threads_problem,
)
from tokenswift.settings.settings import (
    RENAMED,
    TEXT_FIELDS,
    WRITING_DEFAULTS,
    Settings,
    writing_settings,
)
from tokenswift.settings.speculation import PLAIN, SPEED_FIELDS, DraftSettings, Speculation

__all__ = ["CAPACITY_SPARE", "DRAFTERS", "INT64_MAX", "KV_CACHES", "MAX_THREADS", "MAX_WINDOW", "MODES", "NGRAM_LEN",
           "PLAIN", "PROMPT_FORMATS", "RENAMED", "REPEAT_RANGE", "ROPE_SLACK", "SPEED_FIELDS", "TEXT_FIELDS",
           "WRITING_DEFAULTS", "DraftSettings", "Settings", "SettingsError", "Speculation", "lone_surrogate",
           "max_nodes", "threads_problem", "writing_settings"]
