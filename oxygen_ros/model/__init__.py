"""The pi0.5 model layer: configs, the Mixture-of-Transformers in torch, its static KV cache, and I/O around it.

Import from the modules themselves (`from oxygen_ros.model.pi05 import build_model`), so a light module such as
`oxygen_ros.model.config` does not pull in transformers.
"""
