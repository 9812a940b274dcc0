"""model: loading (HF dir, GGUF, embedded default, LoRA, tiny test model), log-probs, precision."""
