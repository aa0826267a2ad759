"""Benchmarks: scripts that measure the layers and print the figures recorded in docs/benchmarks.md."""
