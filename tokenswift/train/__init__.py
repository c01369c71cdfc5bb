"""Training and evaluating drafters: data, features, heads, the draft layer."""
