"""The model: configuration, loading (Hugging Face and GGUF) with its draft heads and draft layer, the forward,
attention, RoPE, the KV cache and the partial cache, int4."""
