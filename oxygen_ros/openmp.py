"""OpenMP's wait policy for processes that run torch from several threads at once (the fleet's stage workers).

libgomp, torch's OpenMP runtime on Linux, keeps the worker threads of every team spinning for a while after each
parallel region. Each Python thread that runs torch operators leads its own team, so with two stage workers side
by side (or one stage worker while other threads preprocess frames) the idle team's spinning threads take the
cores the busy one needs. Measured on a 2-core CPU serving 8 robots at 10 Hz on two tiny models with the Robion
lockstep: 25 chunks in 40 s with the default policy, every frame (80 chunks/s) with `OMP_WAIT_POLICY=PASSIVE`; the
whole-device design served every frame either way (`docs/fleet.md`). libgomp reads the variable once, when it is
loaded, so it must be set before torch is imported. Only the standard library is imported here.
"""

from __future__ import annotations

import os

VARIABLE = "OMP_WAIT_POLICY"


def prefer_passive_waits() -> None:
    """Idle OpenMP threads sleep instead of spinning, unless the environment already says otherwise."""
    os.environ.setdefault(VARIABLE, "PASSIVE")
