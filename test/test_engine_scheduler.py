"""The scheduler alone, without a model: plans for given queues, deadlines and pool states."""

import math

import pytest

from oxygen_ros.engine.language import LanguageRequest
from oxygen_ros.engine.scheduler import ActionFrame, Scheduler, SchedulerConfig, bucket_for, deadline_missed


class TableCost:
    """A fixed cost table, as the simulator would give: action 10 ms (+ 1 ms per frame), decode 2 ms per step."""

    def __init__(self, action=None):
        self.action = action or {}

    def action_s(self, model_id, batch):
        return self.action.get(model_id, 0.010) + 0.001 * batch

    def decode_s(self, model_id, batch):
        return 0.002


def frame(model="a", narrate=True, deadline=1.0, arrival=0.0, robot="r"):
    return ActionFrame(model, None, narrate, deadline, arrival, robot)


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
    frames = [s.add_frame(frame(arrival=t, deadline=10 - t)) for t in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)]
    plan = s.plan_actions(now=1.0)
    assert plan.frames == frames[:4] and plan.bucket == 4 and plan.admit == [True] * 4
    plan = s.plan_actions(now=1.0)
    assert plan.frames == frames[4:] and plan.bucket == 2
    assert s.plan_actions(now=1.0) is None


@pytest.mark.parametrize("queue, first", [("fifo", "a"), ("esf", "b"), ("lqf", "a")])
def test_queue_policies_pick_which_models_frames_run_first(queue, first):
    s = Scheduler(SchedulerConfig(queue=queue, max_batch=4), {"a": 2, "b": 2}, TableCost())
    for t in (0.0, 0.01, 0.02):
        s.add_frame(frame("a", arrival=t, deadline=1.0))
    s.add_frame(frame("b", arrival=0.05, deadline=0.5))  # the tighter deadline, but it arrived last
    assert s.plan_actions(now=0.1).model_id == first


def test_esf_ranks_a_hopeless_frame_after_one_that_can_still_make_it():
    s = Scheduler(SchedulerConfig(queue="esf"), {"a": 2, "b": 2}, TableCost({"a": 0.5}))
    s.add_frame(frame("a", deadline=0.3))  # needs 0.5 s: already lost
    s.add_frame(frame("b", deadline=0.4))
    assert s.plan_actions(now=0.0).model_id == "b"
    assert s.plan_actions(now=0.0).model_id == "a"


def test_round_robin_alternates_models():
    s = Scheduler(SchedulerConfig(queue="rr"), {"a": 2, "b": 2})
    for _ in range(2):
        s.add_frame(frame("a"))
        s.add_frame(frame("b"))
    assert [s.plan_actions(0.0).model_id for _ in range(4)] == ["a", "b", "a", "b"]


@pytest.mark.parametrize("admission", ["drop_new", "drop_oldest", "preempt"])
def test_a_full_model_follows_its_admission_policy(admission):
    s = Scheduler(SchedulerConfig(admission=admission), {"a": 2})
    old = [request(s), request(s)]
    plan = s.plan_actions(0.0) if s.add_frame(frame()) else None
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
    s.add_frame(frame())
    s.plan_actions(0.0)  # preempts `first`
    newer = request(s)
    s.add_frame(frame())
    plan = s.plan_actions(0.0)  # preempts `newer`; the cap of 1 drops `first`
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
    old = scheduler.add_frame(frame("a", deadline=0.10, robot="r1"))
    fresh = scheduler.add_frame(frame("a", deadline=0.30, robot="r2"))
    other = scheduler.add_frame(frame("b", deadline=0.05, robot="r3"))
    assert scheduler.take_expired(0.08) == [other]  # b's frame is past its deadline at 0.08
    assert scheduler.take_expired(0.10) == []  # a deadline is met at its own instant
    assert scheduler.take_expired(0.2) == [old]
    plan = scheduler.plan_actions(0.2)
    assert plan.frames == [fresh] and scheduler.frames_pending == 0
    # without drop_expired (one robot's node) a late frame is still computed; its chunk is then counted late
    keep = Scheduler(SchedulerConfig(), {"a": 1}, TableCost())
    late = keep.add_frame(frame("a", deadline=0.1))
    assert keep.take_expired(5.0) == [] and keep.plan_actions(5.0).frames == [late]


def test_a_stage_split_asks_admission_when_a_batch_finishes_its_action_stage():
    scheduler = Scheduler(SchedulerConfig(max_batch=2, admission="drop_new"), {"a": 1}, TableCost())
    frames = [scheduler.register(frame("a", robot=f"r{i}")) for i in range(2)]
    assert scheduler.frames_pending == 0  # registered frames wait in the plug-in's queues, not here
    plan = scheduler.plan_admission("a", frames, 2)
    assert plan.admit == [True, False] and plan.refused == [frames[1]]
