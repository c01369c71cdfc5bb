"""Drafters: the draft heads, the fused drafter, the draft layer, and the interface they share."""
