"""Errors the engine raises for bad checkpoints, so callers can catch one type and show its message."""


class ModelLoadError(RuntimeError):
    """A model, tokenizer or draft-head checkpoint could not be found or read; the message says which."""
