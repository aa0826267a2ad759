"""OpenMP's waits: passive for processes that run torch from several threads at once (the fleet's stage workers),
short spins for the others (a robot's node, the benchmarks).

libgomp, torch's OpenMP runtime on Linux, keeps the worker threads of every team spinning for a while after each
parallel region. Each Python thread that runs torch operators leads its own team, so with two stage workers side
by side (or one stage worker while other threads preprocess frames) the idle team's spinning threads take the
cores the busy one needs. Measured on a 2-core CPU serving 8 robots at 10 Hz on two tiny models with the Robion
lockstep: 25 chunks in 40 s with the default policy, every frame (80 chunks/s) with `OMP_WAIT_POLICY=PASSIVE`; the
whole-device design served every frame either way (`docs/results/2026-12-fleet.md`). libgomp reads the variable once, when it is
loaded, so it must be set before torch is imported. Only the standard library is imported here.

Elsewhere the team's threads may spin, but not for long: by default an idle libgomp thread spins for 300,000
rounds of a pause loop, several milliseconds here, so a thread that starts torch work just after another thread's
parallel region waits for the scheduler to preempt the spinning one. That is the engine's decode worker when it
starts a step beside a denoising (`RuntimeConfig.overlap_threads`): its step started 2-5 ms after the denoising,
0.3 ms with `GOMP_SPINCOUNT=10000`. Measured on 2 cores (fullvocab, float32, continuous batching with overlap, two
runs each): a frame took 51.3-52.9 ms with 10,000 rounds against 55.7-57.6 by default and 56.7-58.7 passive, while
an action-only frame took 43.7-45.6 ms with 10,000 rounds, 43.6-47.2 by default and 51.0-53.8 passive (three
runs each); so in float32 10,000 rounds cost the arm nothing alone (in bfloat16 up to a few percent, in some
runs) and give the overlap back its start (docs/benchmarks.md).
"""

from __future__ import annotations

import os

VARIABLE = "OMP_WAIT_POLICY"
SPIN_VARIABLE = "GOMP_SPINCOUNT"  # libgomp's rounds of spinning before an idle thread sleeps
SHORT_SPINS = "10000"


def prefer_passive_waits() -> None:
    """Idle OpenMP threads sleep instead of spinning, unless the environment already says otherwise."""
    os.environ.setdefault(VARIABLE, "PASSIVE")


def prefer_short_spins() -> None:
    """Idle OpenMP threads spin for SHORT_SPINS rounds before they sleep, unless the environment sets a wait policy
    or a spin count itself."""
    if VARIABLE not in os.environ:
        os.environ.setdefault(SPIN_VARIABLE, SHORT_SPINS)
