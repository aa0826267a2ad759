"""The scheduler alone, without a model: plans for given queues, deadlines and pool states."""

import math

import pytest

from oxygen_ros.engine.frames import ActionFrame, bucket_for, deadline_missed
from oxygen_ros.engine.language import LanguageRequest
from oxygen_ros.engine.planners import WHOLE
from oxygen_ros.engine.queues import FrameQueues, make_policy
from oxygen_ros.engine.scheduler import Scheduler, SchedulerConfig


class TableCost:
    """A fixed cost table, as the simulator would give: action 10 ms (+ 1 ms per frame), decode 2 ms per step."""

    def __init__(self, action=None):
        self.action = action or {}

    def action_s(self, model_id, batch):
        return self.action.get(model_id, 0.010) + 0.001 * batch

    def action_share(self, model_id, batch):
        return 1.0

    def decode_s(self, model_id, batch):
        return 0.002

    def observe(self, model_id, kind, batch, seconds):
        pass


def frame(model="a", narrate=True, deadline=1.0, arrival=0.0, robot="r"):
    return ActionFrame(model, None, narrate, deadline, arrival, robot)


def next_batch(scheduler, now):
    """The next whole-device batch (ended at once) with its admission plan, or None."""
    jobs = scheduler.start(now)
    if not jobs:
        return None
    (job,) = jobs
    (batch,) = job.batches
    assert batch.stage == WHOLE and scheduler.finish(job, now) == batch.frames
    return scheduler.plan_admission(batch.model_id, batch.frames, batch.bucket)


def request(scheduler, model="a", tokens=1):
    r = LanguageRequest(scheduler.new_request_id(), 0, 0, 0, 8, 8, 10, -1)
    r.tokens = [5] * tokens
    scheduler.activate(model, r, inputs=f"inputs of {r.request_id}")
    return r


def test_buckets_and_the_one_deadline_definition():
    assert [bucket_for(n, 8) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    assert bucket_for(3, 2) == 2
    assert not deadline_missed(1.0, 1.0) and deadline_missed(1.001, 1.0)
    with pytest.raises(ValueError):
        SchedulerConfig(max_batch=3)


def test_fifo_batches_one_models_frames_in_arrival_order_up_to_max_batch():
    s = Scheduler(SchedulerConfig(max_batch=4), {"a": 4})
    frames = [s.submit(frame(arrival=t, deadline=10 - t)) for t in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)]
    plan = next_batch(s, 1.0)
    assert plan.frames == frames[:4] and plan.bucket == 4 and plan.admit == [True] * 4
    plan = next_batch(s, 1.0)
    assert plan.frames == frames[4:] and plan.bucket == 2
    assert next_batch(s, 1.0) is None


@pytest.mark.parametrize("queue, first", [("fifo", "a"), ("esf", "b"), ("lqf", "a")])
def test_queue_policies_pick_which_models_frames_run_first(queue, first):
    s = Scheduler(SchedulerConfig(queue=queue, max_batch=4), {"a": 2, "b": 2}, TableCost())
    for t in (0.0, 0.01, 0.02):
        s.submit(frame("a", arrival=t, deadline=1.0))
    s.submit(frame("b", arrival=0.05, deadline=0.5))  # the tighter deadline, but it arrived last
    assert next_batch(s, 0.1).model_id == first


def test_esf_ranks_a_hopeless_frame_after_one_that_can_still_make_it():
    s = Scheduler(SchedulerConfig(queue="esf"), {"a": 2, "b": 2}, TableCost({"a": 0.5}))
    s.submit(frame("a", deadline=0.3))  # needs 0.5 s: already lost
    s.submit(frame("b", deadline=0.4))
    assert next_batch(s, 0.0).model_id == "b"
    assert next_batch(s, 0.0).model_id == "a"


def test_round_robin_alternates_models():
    s = Scheduler(SchedulerConfig(queue="rr"), {"a": 2, "b": 2})
    for _ in range(2):
        s.submit(frame("a"))
        s.submit(frame("b"))
    assert [next_batch(s, 0.0).model_id for _ in range(4)] == ["a", "b", "a", "b"]


@pytest.mark.parametrize("admission", ["drop_new", "drop_oldest", "preempt"])
def test_a_full_model_follows_its_admission_policy(admission):
    s = Scheduler(SchedulerConfig(admission=admission), {"a": 2})
    old = [request(s), request(s)]
    plan = next_batch(s, 0.0) if s.submit(frame()) else None
    if admission == "drop_new":
        assert plan.admit == [False] and plan.refused and not plan.displaced
        assert s.models["a"].active == old and s.requests_dropped == 1
    else:
        assert plan.admit == [True] and [d.request for d in plan.displaced] == [old[0]]
        assert s.models["a"].active == [old[1]]
        assert plan.displaced[0].preempted == (admission == "preempt")
        assert s.requests_dropped == (0 if admission == "preempt" else 1)


def test_preempted_requests_resume_first_and_past_the_cap_the_oldest_is_dropped():
    s = Scheduler(SchedulerConfig(admission="preempt", max_preempted=1), {"a": 1})
    first = request(s)
    s.submit(frame())
    next_batch(s, 0.0)  # preempts `first`
    newer = request(s)
    s.submit(frame())
    plan = next_batch(s, 0.0)  # preempts `newer`; the cap of 1 drops `first`
    assert plan.dropped == [first] and s.requests_dropped == 1 and s.requests_preempted == 2
    assert [r for r, _ in s.models["a"].preempted] == [newer]
    # the new request of this frame never became active (no model here): the slot is free, `newer` resumes
    decode = s.plan_decode(0.0)
    assert decode.resume == [(newer, f"inputs of {newer.request_id}")] and decode.requests == [newer]
    assert s.requests_resumed == 1


def test_decode_plan_takes_turns_over_models_and_fits_the_slack():
    s = Scheduler(SchedulerConfig(tokens_per_frame=3), {"a": 4, "b": 4}, TableCost())
    a = [request(s, "a") for _ in range(3)]
    b = [request(s, "b")]
    plans = [s.plan_decode(0.0) for _ in range(2)]
    assert [(p.model_id, p.requests, p.steps) for p in plans] == [("a", a, 3), ("b", b, 3)]
    assert s.plan_decode(0.0, slack_s=0.0045).steps == 2  # two 2 ms steps fit in 4.5 ms
    assert s.plan_decode(0.0, slack_s=0.001) is None  # not even one
    assert s.plan_decode(0.0, slack_s=math.inf, max_steps=0) is None


def test_retire_removes_finished_requests():
    s = Scheduler(SchedulerConfig(), {"a": 3})
    done, running = request(s), request(s)
    done.finish("length", 0.0)
    assert s.retire("a") == [done] and s.models["a"].active == [running]
    assert s.has_language_requests() and s.language_requests() == 1


def test_max_preempted_is_validated():
    with pytest.raises(ValueError, match="max_preempted"):
        SchedulerConfig(max_preempted=-1)


def test_frames_whose_deadline_passed_in_the_queue_are_dropped_before_compute():
    scheduler = Scheduler(SchedulerConfig(max_batch=4, queue="esf", drop_expired=True), {"a": 2, "b": 2},
                          TableCost())
    old = scheduler.submit(frame("a", deadline=0.10, robot="r1"))
    fresh = scheduler.submit(frame("a", deadline=0.30, robot="r2"))
    other = scheduler.submit(frame("b", deadline=0.05, robot="r3"))
    queues = scheduler.planner.queues  # dropped when a batch is cut, before any compute: here, look at the queues
    assert queues.take_expired(0.08) == [other] and other.dropped  # b's frame is past its deadline at 0.08
    assert queues.take_expired(0.10) == []  # a deadline is met at its own instant
    assert next_batch(scheduler, 0.2).frames == [fresh] and scheduler.take_expired() == [old] and old.dropped
    assert scheduler.frames_pending == 0 and scheduler.take_expired() == []
    # without drop_expired (one robot's node) a late frame is still computed; its chunk is then counted late
    keep = Scheduler(SchedulerConfig(), {"a": 1}, TableCost())
    late = keep.submit(frame("a", deadline=0.1))
    assert next_batch(keep, 5.0).frames == [late] and keep.take_expired() == []


def test_a_stage_split_asks_admission_when_a_batch_finishes_its_action_stage():
    scheduler = Scheduler(SchedulerConfig(max_batch=2, admission="drop_new"), {"a": 1}, TableCost())
    frames = [frame("a", robot=f"r{i}") for i in range(2)]
    plan = scheduler.plan_admission("a", frames, 2)
    assert plan.admit == [True, False] and plan.refused == [frames[1]]


def test_a_frame_is_planned_only_from_its_arrival_on():
    """A replay can queue a whole arrival list up front: each decision still sees only what had arrived."""
    s = Scheduler(SchedulerConfig(max_batch=4, queue="esf"), {"a": 2}, TableCost())
    early, late = s.submit(frame(arrival=0.1)), s.submit(frame(arrival=0.3))
    assert s.start(0.05) == [] and s.frames_pending == 2
    assert next_batch(s, 0.2).frames == [early]
    assert next_batch(s, 0.3).frames == [late] and s.frames_pending == 0


def queues_of(*frames):
    queues = FrameQueues()
    for f in frames:
        queues.push(f)
    return queues


def test_esf_orders_by_slack_not_by_deadline_and_puts_hopeless_heads_last():
    queues = queues_of(frame("light", deadline=0.50), frame("heavy", deadline=0.60))
    # the heavy model's frame has the later deadline but much more work left: less slack
    assert make_policy("esf").choose(queues, 0.0, {"light": 0.05, "heavy": 0.30}.get) == "heavy"
    assert make_policy("esf").choose(queues, 0.0, {"light": 0.05, "heavy": 0.05}.get) == "light"
    hopeless = queues_of(frame("late", deadline=0.10), frame("ok", deadline=0.40))
    assert make_policy("esf").choose(hopeless, 0.0, {"late": 0.2, "ok": 0.2}.get) == "ok"


def test_round_robin_and_largest_queue_first_and_unknown_policies():
    queues = queues_of(*[frame(m, deadline=1.0 - 0.01 * i) for i, m in enumerate("abbccc")])
    rr = make_policy("rr")
    assert [rr.choose(queues, 0.0, lambda m: 0.0) for _ in range(4)] == ["a", "b", "c", "a"]
    assert make_policy("lqf").choose(queues, 0.0, lambda m: 0.0) == "c"
    assert make_policy("esf").choose(FrameQueues(), 0.0, lambda m: 0.0) is None
    with pytest.raises(ValueError, match="unknown queue policy"):
        make_policy("edf")


def test_a_batch_takes_the_earliest_deadlines_and_pads_to_its_bucket():
    s = Scheduler(SchedulerConfig(max_batch=4, queue="esf"), {"m": 2}, TableCost())
    frames = [s.submit(frame("m", deadline=d)) for d in (0.9, 0.3, 0.5, 0.7, 0.1, 0.8)]
    first = next_batch(s, 0.0)
    assert first.frames == [frames[i] for i in (4, 1, 2, 3)] and first.bucket == 4
    second = next_batch(s, 0.0)
    assert second.frames == [frames[5], frames[0]] and second.bucket == 2
    for _ in range(3):
        s.submit(frame("m"))
    assert next_batch(s, 0.0).bucket == 4  # three frames, one padding row


def test_the_decode_policy_fixed_k_and_adaptive_k_with_its_floor():
    fixed = Scheduler(SchedulerConfig(tokens_per_frame=3), {"a": 4}, TableCost())
    assert fixed.owe_for_frame() is None  # no language work: nothing owed
    r = request(fixed)
    assert fixed.owe_for_frame() == 3
    assert fixed.plan_language(0.0, owed=3, last_control_start=0.0).steps == 3
    assert fixed.plan_language(0.0, owed=0, last_control_start=0.0) is None  # the frame's steps are done
    assert fixed.plan_language(0.0, owed=0, last_control_start=0.0, draining=True).requests == [r]
    cfg = SchedulerConfig(adaptive_k=True, tokens_per_frame=5, min_steps_per_frame=1, control_period_s=0.1)
    adaptive = Scheduler(cfg, {"a": 4}, TableCost())
    request(adaptive)
    assert adaptive.owe_for_frame() == 1  # the floor
    floor = adaptive.plan_language(0.095, owed=1, last_control_start=0.0)
    assert floor.steps == 1 and floor.floor_due == pytest.approx(0.1)  # owed whatever the slack; costs past 0.1
    slack = adaptive.plan_language(0.095, owed=0, last_control_start=0.0)
    assert slack.steps == 2 and slack.floor_due is None  # two 2 ms steps fit in the 5 ms left before the tick
    adaptive.decoded(4)
    assert adaptive.plan_language(0.2, owed=0, last_control_start=0.0).steps == 1  # idle: the cap per period
    assert adaptive.plan_language(0.099, owed=0, last_control_start=0.0) is None  # not even one step fits
