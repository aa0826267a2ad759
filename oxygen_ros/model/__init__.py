"""The pi0.5 model layer: configs, the Mixture-of-Transformers in torch, its static KV cache, and I/O around it."""
