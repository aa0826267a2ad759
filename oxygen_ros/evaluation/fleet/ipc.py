"""``oxygen-ros fleet-ipc``: the measured cost of handing a stage's output from one process to another, per batch
bucket, for the designs that run the VLM and action stages in separate processes
(``fleet/baselines.py``).

Three hops per request batch, with their real payloads for a model config (tensors in the model dtype, plus the
batch's request metadata: ids, robot, model, arrival, deadline):

- ``input``: client -> VLM stage: the camera images (uint8), the state and the prompt tokens;
- ``kv``: VLM stage -> action stage: the prefix K/V, layers x 2 x batch x kv_heads x prefix_len x head_dim, and the
  prefix mask;
- ``output``: action stage -> client: the action chunk.

Three ways, each timed from the sender starting the hand-off to the receiving process holding the tensors and
having acknowledged (one small message back, so a figure is an upper bound of the one-way cost):

- ``pipe``: the payload pickled, sent through a ``multiprocessing`` pipe, unpickled by the receiver;
- ``shm_copy``: the tensors copied into a shared-memory block both processes have mapped, only a handle (offsets,
  shapes, dtypes) and the metadata pickled through the pipe; the receiver views the block as tensors;
- ``shm_handle``: as ``shm_copy`` when the stage already wrote its output into the shared block (a shared KV pool):
  only the handle and metadata cross.

The receiver is a spawned process (a fresh interpreter, as a stage process would be). Repeats are interleaved over
(way, hop, bucket) so load bursts on a shared machine spread over all entries; each entry keeps the median and
the interquartile range / median of its repeats.
"""

from __future__ import annotations

import json
import math
import mmap
import multiprocessing as mp
import os
import pickle
import statistics
import time
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path

import torch

from oxygen_ros.command_line import CommandParser, progress
from oxygen_ros.model.config import Pi05Config, get_preset

HOPS = ("input", "kv", "output")
WAYS = ("pipe", "shm_copy", "shm_handle")
_ALIGN = 64


def hop_tensors(config: Pi05Config, hop: str, batch: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors one hop carries for a batch of ``batch`` requests (random contents, real shapes and dtypes)."""
    if hop == "input":
        side = config.vision.image_size
        return {
            "images": torch.randint(0, 256, (batch, config.num_cameras, 3, side, side), dtype=torch.uint8),
            "state": torch.randn(batch, config.state_dim),
            "tokens": torch.randint(0, config.vocab_size, (batch, config.max_token_len)),
        }
    if hop == "kv":
        b = config.backbone
        return {
            "kv": torch.randn(b.depth, 2, batch, b.num_kv_heads, config.prefix_len, b.head_dim).to(dtype),
            "prefix_mask": torch.ones(batch, config.prefix_len, dtype=torch.bool),
        }
    if hop == "output":
        return {"actions": torch.randn(batch, config.action_horizon, config.action_dim)}
    raise ValueError(f"unknown hop {hop!r}; choose from {HOPS}")


def kv_bytes_per_request(config: Pi05Config, dtype: torch.dtype) -> int:
    """Bytes of one request's prefix K/V: layers x 2 x kv_heads x prefix_len x head_dim in ``dtype``."""
    b = config.backbone
    return b.depth * 2 * b.num_kv_heads * config.prefix_len * b.head_dim * torch.empty((), dtype=dtype).element_size()


def request_metadata(batch: int) -> list[dict]:
    """What travels with every request besides its tensors."""
    return [{"request_id": i, "robot_id": f"robot{i}", "model_id": "model", "arrival": 0.0, "deadline": 0.1}
            for i in range(batch)]


def payload_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


@dataclass(frozen=True)
class _Field:
    name: str
    offset: int
    shape: tuple[int, ...]
    dtype: str


def _layout(tensors: dict[str, torch.Tensor]) -> tuple[list[_Field], int]:
    fields, offset = [], 0
    for name, tensor in tensors.items():
        fields.append(_Field(name, offset, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch.")))
        offset += math.ceil(tensor.numel() * tensor.element_size() / _ALIGN) * _ALIGN
    return fields, offset


def _views(buffer, fields: list[_Field]) -> dict[str, torch.Tensor]:
    """Tensors over a shared buffer, without copying."""
    views = {}
    for field in fields:
        dtype = getattr(torch, field.dtype)
        count = math.prod(field.shape)
        views[field.name] = torch.frombuffer(buffer, dtype=dtype, count=count, offset=field.offset).view(field.shape)
    return views


def _receiver(conn, block_name: str, block_size: int) -> None:
    """The receiving stage process: rebuild each payload as tensors, then acknowledge."""
    with open(f"/dev/shm/{block_name}", "r+b") as file:
        block = mmap.mmap(file.fileno(), block_size)
    while True:
        message = conn.recv_bytes()
        kind, body = message[:1], message[1:]
        if kind == b"q":
            return
        if kind == b"p":
            _meta, tensors = pickle.loads(body)
        else:
            _meta, fields = pickle.loads(body)
            tensors = _views(block, fields)
        if not tensors:
            raise RuntimeError("empty payload")
        conn.send_bytes(b"k")


class HopBench:
    """A receiving process and a shared block sized for the largest payload; ``time(way, tensors, meta)``."""

    def __init__(self, block_size: int):
        self.block = SharedMemory(create=True, size=max(block_size, _ALIGN))
        self.conn, child = mp.get_context("spawn").Pipe()
        self.process = mp.get_context("spawn").Process(
            target=_receiver, args=(child, self.block.name, self.block.size), daemon=True
        )
        self.process.start()
        child.close()

    def time(self, way: str, tensors: dict[str, torch.Tensor], meta: list[dict]) -> float:
        """Seconds from the start of the hand-off to the receiver's acknowledgement."""
        fields, _ = _layout(tensors)
        views = _views(self.block.buf, fields)
        if way == "shm_handle":  # the sender's output already lives in the shared block
            for field in fields:
                views[field.name].copy_(tensors[field.name])
        start = time.perf_counter()
        if way == "pipe":
            self.conn.send_bytes(b"p" + pickle.dumps((meta, tensors), protocol=pickle.HIGHEST_PROTOCOL))
        elif way in ("shm_copy", "shm_handle"):
            if way == "shm_copy":
                for field in fields:
                    views[field.name].copy_(tensors[field.name])
            self.conn.send_bytes(b"h" + pickle.dumps((meta, fields), protocol=pickle.HIGHEST_PROTOCOL))
        else:
            raise ValueError(f"unknown way {way!r}; choose from {WAYS}")
        if self.conn.recv_bytes() != b"k":
            raise RuntimeError("the receiving process did not acknowledge")
        seconds = time.perf_counter() - start
        del views
        return seconds

    def close(self) -> None:
        if self.process.is_alive():
            self.conn.send_bytes(b"q")
            self.process.join(timeout=30)
        self.conn.close()
        self.block.close()
        self.block.unlink()


def measure_hops(config: Pi05Config, config_name: str, buckets: list[int], dtype: torch.dtype,
                 repeats: int = 7, warmup: int = 1, ways=WAYS) -> dict:
    """Median hand-off seconds per way, hop and bucket, with the payload bytes and how they were measured."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    payloads = {(hop, b): hop_tensors(config, hop, b, dtype) for hop in HOPS for b in buckets}
    metas = {b: request_metadata(b) for b in buckets}
    keys = [(way, hop, b) for way in ways for hop in HOPS for b in buckets]
    block_size = max(_layout(t)[1] for t in payloads.values())
    load_before = os.getloadavg()[0]
    bench = HopBench(block_size)
    samples: dict[tuple, list[float]] = {key: [] for key in keys}
    try:
        for _ in range(warmup):
            for way, hop, b in keys:
                bench.time(way, payloads[(hop, b)], metas[b])
        for _ in progress(range(repeats), desc="ipc rounds"):
            for key in keys:
                way, hop, b = key
                samples[key].append(bench.time(way, payloads[(hop, b)], metas[b]))
    finally:
        bench.close()
    seconds: dict = {way: {hop: {} for hop in HOPS} for way in ways}
    spread: dict = {way: {hop: {} for hop in HOPS} for way in ways}
    for (way, hop, b), times in samples.items():
        median = statistics.median(times)
        seconds[way][hop][str(b)] = median
        if len(times) >= 4:
            q1, _, q3 = statistics.quantiles(times, n=4)
            spread[way][hop][str(b)] = (q3 - q1) / median
    return {
        "meta": {
            "config": config_name,
            "dtype": str(dtype).removeprefix("torch."),
            "buckets": list(buckets),
            "repeats": repeats,
            "warmup": warmup,
            "statistic": "median",
            "interleaved": True,
            "timed": "sender starts the hand-off -> receiver holds the tensors and has acknowledged (one small "
                     "message back); receiver: a spawned process",
            "kv_bytes_per_request": kv_bytes_per_request(config, dtype),
            "load_before": load_before,
            "load_after": os.getloadavg()[0],
            "cpu_count": os.cpu_count(),
        },
        "bytes": {hop: {str(b): payload_bytes(payloads[(hop, b)]) for b in buckets} for hop in HOPS},
        "seconds": seconds,
        "relative_iqr": spread,
    }


def hop_seconds(ipc: dict, way: str) -> dict[str, dict[int, float]]:
    """One way's median seconds from a ``measure_hops`` report: hop -> bucket -> seconds."""
    if way not in ipc["seconds"]:
        raise ValueError(f"the IPC report has no {way!r} figures; it has {sorted(ipc['seconds'])}")
    return {hop: {int(b): s for b, s in buckets.items()} for hop, buckets in ipc["seconds"][way].items()}


def _config(text: str) -> Pi05Config:
    return Pi05Config.load_json(text) if text.endswith(".json") else get_preset(text)


def build_parser():
    p = CommandParser("fleet-ipc", __doc__)
    p.add_argument("--config", default="pi05", help="model preset or config JSON whose payloads are handed over")
    p.add_argument("--dtype", default="bfloat16", help="dtype of the K/V (the model's serving dtype)")
    p.add_argument("--buckets", default="1,2,4,8", help="batch buckets to measure")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per entry (median kept)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--out", required=True, help="JSON file to write")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = _config(args.config)
    dtype = getattr(torch, args.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {args.dtype!r}")
    buckets = [int(b) for b in args.buckets.split(",") if b]
    report = measure_hops(config, args.config, buckets, dtype, args.repeats, args.warmup)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"{args.config} ({report['meta']['dtype']}): K/V {report['meta']['kv_bytes_per_request'] / 1e6:.2f} MB "
          f"per request; load average {report['meta']['load_before']:.1f} -> {report['meta']['load_after']:.1f}")
    print(f"{'way':<12}{'hop':<8}" + "".join(f"{'b=' + str(b):>12}" for b in buckets) + "   (median ms)")
    for way, hops in report["seconds"].items():
        for hop, per_bucket in hops.items():
            print(f"{way:<12}{hop:<8}" + "".join(f"{1e3 * per_bucket[str(b)]:>12.3f}" for b in buckets))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
