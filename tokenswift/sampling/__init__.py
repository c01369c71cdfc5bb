"""Choosing a token: the sampler, its in-graph twin, DRY/XTC, banned phrases, alternatives, position keys."""
