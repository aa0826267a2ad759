"""Fleet simulator: attainment trends, determinism and scale (synthetic LUT)."""


from oxygen_ros.evaluation.fleet.fleets import make_fleet, model_scales
from oxygen_ros.fleet.profile_table import synthetic_table
from oxygen_ros.fleet.simulator import SimConfig, simulate
from oxygen_ros.fleet.traffic import assign_milp_relaxed, robot_loads

LUT8 = synthetic_table(model_scales(8))


def sweep(design, counts, n_models, n_gpus, lut, duration_s=3.0):
    points = {}
    for n in counts:
        robots = make_fleet(n, n_models, seed=0)
        if n_gpus == 1:
            gpu_of = {r.robot_id: 0 for r in robots}
        else:
            gpu_of = assign_milp_relaxed(robots, robot_loads(robots, lut), n_gpus).gpu_of
        points[n] = simulate(robots, gpu_of, lut, SimConfig(design=design, duration_s=duration_s)).attainment
    return points


def test_more_robots_never_raise_attainment():
    points = sweep("robion", [8, 16, 32, 48, 56, 64, 80], 8, 4, LUT8)
    values = [points[n] for n in sorted(points)]
    assert values[0] == 1.0 and values[-1] < 0.9
    assert all(b <= a for a, b in zip(values, values[1:])), points


def test_per_robot_and_overall_metrics_are_consistent_and_deterministic():
    robots = make_fleet(24, 4, seed=3)
    gpu_of = {r.robot_id: i % 2 for i, r in enumerate(robots)}
    lut = synthetic_table(model_scales(4))
    a = simulate(robots, gpu_of, lut, SimConfig(duration_s=2.0, seed=5))
    b = simulate(robots, gpu_of, lut, SimConfig(duration_s=2.0, seed=5))
    assert a.summary() == b.summary() and a.per_robot == b.per_robot
    assert len(a.per_robot) == 24 and 0 < a.attainment <= 1
    met = sum(f.met_deadline for f in a.frames)
    assert a.attainment == met / len(a.frames) and a.miss_ratio == 1 - a.attainment
    for f in a.frames:
        assert f.dropped or (f.finish is not None and f.finish >= f.arrival)
    assert a.latency_p50_s <= a.latency_p99_s


def test_64_robots_8_models_4_gpus_simulates_five_seconds_of_fleet():
    """A large fleet runs through the simulator (its speed is a benchmark's business, not a test's)."""
    robots = make_fleet(64, 8, seed=0)
    assignment = assign_milp_relaxed(robots, robot_loads(robots, LUT8), 4)
    result = simulate(robots, assignment.gpu_of, LUT8, SimConfig(design="robion", duration_s=5.0))
    assert len(result.frames) > 1500 and len({r.model_id for r in robots}) == 8
