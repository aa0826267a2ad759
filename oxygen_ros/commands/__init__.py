"""The `oxygen-ros` command (`cli.py`) and the subcommands that are commands and nothing else: the demos, the tiny
model's training, the fleet's simulator, profiler, traffic controller and benchmarks, the checkpoint download.
A subcommand whose work is a layer's own (converting an episode, a bag report, a node, a benchmark) lives in that
layer; `cli.py` lists them all. Only this folder starts the package's nodes as child
processes (`processes.py`)."""
