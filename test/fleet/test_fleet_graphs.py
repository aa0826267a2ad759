"""CUDA graphs in the fleet's stage split, without a GPU: the option is refused on a CPU with a clear error, and
each (model, stage, bucket, partition) finds its own graph: a graph belongs to the stream it was captured on and
is replayed only there (`model.cuda_graphs.StreamGraphs`; replay against eager on a GPU: test_gpu)."""

from types import SimpleNamespace

import pytest
import torch

from oxygen_ros.commands.fleet_bench import main as bench_main
from oxygen_ros.commands.fleet_profile import main as profile_main
from oxygen_ros.engine.runtime import RuntimeConfig
from oxygen_ros.engine.scheduler import SchedulerConfig
from oxygen_ros.fleet.models import ModelSpec
from oxygen_ros.fleet.profiler import StageProfiler
from oxygen_ros.fleet.server import FleetServer, ServedRobot
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.cuda_graphs import StreamGraphs, graph_bucket
from oxygen_ros.model.pi05 import build_model

from engine_fixtures import tokenizer  # noqa: F401 - pytest fixture


def test_cuda_graphs_are_refused_on_a_cpu(tokenizer, capsys):  # noqa: F811
    with pytest.raises(ValueError, match="cuda_graphs needs a CUDA device, not cpu"):
        StageProfiler([ModelSpec("a", "tiny")], "cpu", max_batch=2, cuda_graphs=True)
    config = RuntimeConfig(SchedulerConfig(max_new_tokens=4, queue="esf", max_batch=2), pool_slots=6, frame_slots=4)
    for design in ("monolithic", "robion"):
        with pytest.raises(ValueError, match="cuda_graphs needs a CUDA device"):
            FleetServer([ModelSpec("a", "tiny")], [ServedRobot("r1", "a", 1.0)], config, lambda model: tokenizer,
                        design=design, cuda_graphs=True)
    for main in (profile_main, bench_main):
        with pytest.raises(SystemExit) as exit_info:
            main(["--cuda-graphs", "--device", "cpu", "--out", "unused"])
        assert exit_info.value.code == 2
        assert "--cuda-graphs needs a CUDA device, not cpu" in capsys.readouterr().err
    with pytest.raises(ValueError, match="CUDA device"):
        build_model(get_preset("tiny"), seed=0).use_cuda_graphs(per_stream=True)
    with pytest.raises(SystemExit) as exit_info:
        profile_main(["--require-sm-partitions", "--device", "cpu", "--out", "unused"])
    assert exit_info.value.code == 2 and "needs a CUDA device" in capsys.readouterr().err


class FakeGraphs:
    """Stands in for one stream's `CudaGraphs`: records where it was made and which buckets it replayed."""

    def __init__(self, model, buckets, stream):
        self.model, self.buckets, self.stream = model, buckets, stream
        self.replayed: list[tuple[str, int]] = []

    def denoise(self, x, *rest):
        self.replayed.append(("action", graph_bucket(self.buckets, x.shape[0])))
        return self

    def decode_logits(self, cache, slots, *rest):
        self.replayed.append(("language", graph_bucket(self.buckets, len(slots))))
        return self


def stream(handle: int, device: str = "cuda:0"):
    return SimpleNamespace(device=device, cuda_stream=handle)


def test_each_model_stage_bucket_and_partition_has_its_own_graph():
    """A stage's call replays the graph of its model, kind (denoise: action stage; decode: language), bucket and
    the stream it is issued on, made for that stream on its first call there."""
    current = {"stream": None}
    models = {name: SimpleNamespace(name=name) for name in ("a", "b")}
    graphs = {name: StreamGraphs(model, (4, 1, 2), current_stream=lambda: current["stream"], make=FakeGraphs)
              for name, model in models.items()}
    vlm_half, action_half, action_whole, language = stream(11), stream(12), stream(13), stream(14)

    def call(model: str, kind: str, batch: int, on) -> FakeGraphs:
        current["stream"] = on
        rows = torch.zeros(batch, 1)
        if kind == "action":
            return graphs[model].denoise(rows)
        return graphs[model].decode_logits(None, list(range(batch)))

    first = call("a", "action", 3, action_half)
    assert first.stream is action_half and first.model is models["a"] and first.buckets == (1, 2, 4)
    assert first.replayed == [("action", 4)]
    assert call("a", "action", 1, action_half) is first and first.replayed[-1] == ("action", 1)
    assert call("a", "action", 3, stream(12)) is first  # another object for the same stream handle
    whole = call("a", "action", 3, action_whole)
    assert whole is not first and whole.stream is action_whole
    talk = call("a", "language", 2, language)
    assert talk not in (first, whole) and talk.replayed == [("language", 2)]
    other = call("b", "action", 3, action_half)
    assert other is not first and other.model is models["b"]
    assert call("a", "action", 2, vlm_half) not in (first, whole, talk)  # a different partition's stream
    assert call("a", "action", 2, stream(12, "cuda:1")) is not first  # the same handle on another device
    assert [len(g._by_stream) for g in graphs.values()] == [5, 1]


def test_graph_buckets():
    assert [graph_bucket((1, 2, 4, 8), n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, None]
