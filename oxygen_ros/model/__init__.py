"""The pi0.5 model layer: configs, the Mixture-of-Transformers in torch, its static KV cache, and I/O around it.

The main names are importable from here (`from oxygen_ros.model import KVCache, Pi05Model`). They resolve on
first use, so importing a light module such as `oxygen_ros.model.config` does not pull in transformers.
"""

import importlib

_EXPORTS = {
    "GemmaConfig": "config",
    "VisionConfig": "config",
    "Pi05Config": "config",
    "PRESETS": "config",
    "get_preset": "config",
    "KVCache": "kv_cache",
    "ModelInputs": "inputs",
    "Pi05Model": "pi05",
    "PrefillResult": "pi05",
    "build_model": "pi05",
    "parameter_counts": "pi05",
    "greedy_decode": "generate",
    "Tokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
    "train_tokenizer": "tokenizer",
    "tokenize_prompt": "prompt",
    "Observation": "preprocess",
    "NormStats": "preprocess",
    "prepare_inputs": "preprocess",
    "robot_actions": "preprocess",
    "CheckpointError": "checkpoint",
    "LoadedCheckpoint": "checkpoint",
    "load_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
