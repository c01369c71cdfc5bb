"""Decoding: settings, the engine loop, the candidate trie, n-grams, the partial cache, the adaptive policy, metrics."""
