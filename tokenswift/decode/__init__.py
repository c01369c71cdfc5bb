"""Decoding: the engine loop, its options and the self-test that picks its path, n-grams, the adaptive policy,
metrics."""
