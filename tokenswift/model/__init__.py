"""The model: configuration, loading (Hugging Face and GGUF), the forward, attention, RoPE, KV cache, int4."""
