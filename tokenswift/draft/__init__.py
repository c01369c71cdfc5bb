"""Drafters: the fused drafter, the paper's two passes, the draft layer's and the draft model's, and the interface
they share (the networks they draft with, the heads and the draft layer, are loaded with the model: model/)."""
