"""The GPU run's figures on one page: `python scripts/gpu_summary.py OUT_DIR` reads the benchmarks' results.json
under OUT_DIR (as gpu_check.sh leaves them, finished or cut) and writes OUT_DIR/summary.md, printed too, with the
published figures each is compared with. Needs only the standard library."""

import json
import sys
from pathlib import Path

# what each figure is compared with (docs/testing.md, "The first run on a lent GPU")
PUBLISHED = [
    "OxyGen (paper): 70.5 Hz actions with 212.9 tokens/s of text, pi0.5 on an RTX 4090",
    "realtime-vla (Triton pi0.5): 22.1 / 29.2 / 38.9 ms a frame for 1 / 2 / 3 camera views, RTX 4090",
    "FlashRT: 17.6 ms a frame, RTX 5090, FP8",
    "vLLM-Omni (merged pi0.5 path): 349 ms a frame, RTX 4090, eager",
]
SETTINGS = ("action_only", "baseline", "continuous_batching", "continuous_batching_overlap")


def rows(records: list[dict]) -> list[str]:
    lines = []
    for r in records:
        if r.get("sweep") != "goals" or r.get("setting") not in SETTINGS:
            continue
        joules = r.get("energy_j_per_frame")
        lines.append(f"| {r['preset']} | {r['dtype']} | {'on' if r['cuda_graphs'] else 'off'} | {r['setting']} | "
                     f"{r['action_latency_p50_ms']:.1f} | {r['action_hz']:.1f} | {r['tokens_per_s']:.1f} | "
                     f"{'-' if joules is None else f'{joules:.3f}'} |")
    return lines


def frame_parts(out: Path) -> list[str]:
    """The frame's parts (frame_parts.json, if that step left one): wall clock beside device time."""
    path = out / "frame_parts" / "frame_parts.json"
    if not path.exists():
        return []
    found = json.loads(path.read_text())
    lines = ["", f"Where a frame's time goes ({found['preset']}, {found['dtype']}, {found['steps']} denoising steps; "
             "median of the calls):", "", "| part | mode | wall ms | device ms |", "|---|---|---|---|"]
    for key, row in found.get("parts", {}).items():
        part, mode = key.rsplit(" ", 1)
        lines.append(f"| {part} | {mode} | {row['wall_ms']:.2f} | {row['device_ms']:.2f} |")
    return lines


def main(out: Path) -> int:
    lines = ["# GPU run: the goal point (50 tokens a request, one request a frame, 10 denoising steps)", "",
             "| preset | dtype | CUDA graphs | setting | p50 ms a frame | action Hz | tokens/s | J a request |",
             "|---|---|---|---|---|---|---|---|"]
    found = sorted(out.glob("*/results.json"))
    for path in found:
        lines += rows(json.loads(path.read_text()))
    if not found:
        lines.append("| no results.json under this folder: no benchmark step finished a point | | | | | | | |")
    lines += frame_parts(out)
    lines += ["", "One request a frame, so J a request is the NVML energy of one frame with its share of the text.",
              "", "Compared with:", *[f"- {line}" for line in PUBLISHED], ""]
    (out / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        raise SystemExit("usage: python scripts/gpu_summary.py OUT_DIR (a folder gpu_check.sh wrote)")
    raise SystemExit(main(Path(sys.argv[1])))
