"""CUDA streams for the two paths of the threaded runtime: the control path high, the language worker low.

On a GPU the control path (prefill, denoise) issues its kernels on a high-priority stream and the language worker
its decode steps on a low-priority one, so a decode step that is on the device when the control path launches
gives way to it block by block, and decode steps can fill the SMs the action chunk leaves idle. On a CPU both
contexts do nothing and the `ControlGate` alone orders the two paths.

Why no events are needed between the two streams (each hand-over already passes through a host sync):
- A frame's slot reaches the language worker only after the control thread read that prefill's first-token logits
  back to the host, so its prefix K/V is complete before any decode step can read it.
- The language worker frees a slot only after reading its step's tokens back, so nothing of it is in flight when
  the control path prefills into that slot again; an eviction by the control path happens inside the gate, after
  the last decode step's readback.
- While the control stream denoises a chunk from slot S, decode steps write only the text part of their own
  slots, never a prefix, and never slot S's prefix.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

HIGHEST_PRIORITY = -100  # CUDA clamps stream priorities into its range; lower numbers run first
LOWEST_PRIORITY = 0


class PathStreams:
    """`prioritized=False` gives two streams of equal priority (two independent workers, as two processes would be)."""

    def __init__(self, device: torch.device | str, prioritized: bool = True):
        device = torch.device(device)
        self.enabled = device.type == "cuda"
        high = HIGHEST_PRIORITY if prioritized else LOWEST_PRIORITY
        self.control_stream = torch.cuda.Stream(device, priority=high) if self.enabled else None
        self.language_stream = torch.cuda.Stream(device, priority=LOWEST_PRIORITY) if self.enabled else None

    def control(self):
        """Make the control stream current for the calling thread (a no-op on a CPU)."""
        return torch.cuda.stream(self.control_stream) if self.enabled else nullcontext()

    def language(self):
        """Make the language stream current for the calling thread (a no-op on a CPU)."""
        return torch.cuda.stream(self.language_stream) if self.enabled else nullcontext()
