"""openpi's remote-inference protocol in front of the engine: `oxygen-ros serve` (docs/serve.md)."""
