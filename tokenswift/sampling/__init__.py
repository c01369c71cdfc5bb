"""Choosing a token: the sampler, its in-graph twin, the candidate trie and its walk, DRY/XTC, banned phrases,
alternatives, position keys."""
