"""The lifecycle every node that commands robots goes through, in one place (the VLA node and the fleet node).

A managed node: constructing it reads and checks its parameters (a bad one is one start-up line, exit 1);
`configure` builds what it runs (`_configure`: the model or the fleet server, subscriptions and publishers) and a
failure leaves nothing half-made (the node is unconfigured again, the reason in `failure`, the log and its status);
`activate` starts acting (`_start_acting`); `deactivate`, `shutdown`, a lifecycle error and the process's exit
stop it (`_stop_acting`: every commanded group gets its hold) and `cleanup` / `shutdown` release what configure made
(`_release_engine`, then every subscription and publisher configure created). `autostart` walks the node to
active as a lifecycle manager would; `main` runs a node class as a process (`entry`, `lifecycle`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import rclpy
from rclpy.duration import Duration
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.subscription import Subscription

from oxygen_ros.robots.engine_params import ParameterError

from .lifecycle import ros_process, spinning

FLUSH_S = 1.0  # how long releasing the publishers waits for the holds to be acknowledged


class ManagedNode(LifecycleNode):
    """Subclasses set `autostart_param` (walk to active at start) in their constructor and give the hooks."""

    def __init__(self, name: str, context=None):
        super().__init__(name, context=context)
        self.lifecycle = "unconfigured"
        self.failure = ""  # why the last configure failed, until one succeeds
        self.autostart_param = True
        self.worker_error: BaseException | None = None  # a worker thread's failure, kept for the exit status
        self._autostarting = False
        self._entities: list = []  # subscriptions and publishers made by configure, destroyed by cleanup

    # ---- what each node adds ----------------------------------------------------------------------------------

    def _configure(self) -> None:
        """Everything slow: the engine, then the inputs and outputs; raises with the reason."""
        raise NotImplementedError

    def _release_engine(self) -> None:
        """Undo what `_configure` made besides its subscriptions and publishers (whatever of it was done)."""

    def _start_acting(self) -> None:
        """On activation, before the node is active."""

    def _stop_acting(self, reason: str) -> None:
        """The node stops commanding (once not active): every commanded group gets its hold."""

    def _entered(self, lifecycle: str, detail: str, failed: bool = False) -> None:
        """The node's lifecycle state changed (`detail` says why, for its status; `failed`: a configure failed)."""
        self.lifecycle = lifecycle

    # ---- the transitions ----------------------------------------------------------------------------------------

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        before = set(self._owned())
        try:
            self._configure()
        except Exception as err:  # a model that does not load, a topic name that is not valid, a bad file ...
            self._entities = [e for e in self._owned() if e not in before]
            self._release()
            self.failure = str(err) if isinstance(err, ValueError | OSError) else f"{type(err).__name__}: {err}"
            self._entered("unconfigured", self.failure, failed=True)
            if not self._autostarting:  # autostart reports it as the process's one start-up line
                self.get_logger().error(f"configure failed, still unconfigured: {self.failure}")
            return TransitionCallbackReturn.FAILURE
        self._entities = [e for e in self._owned() if e not in before]
        self.failure = ""
        self._entered("inactive", "configured; activate to act")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._start_acting()
        self._entered("active", "")
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._entered("inactive", "deactivated; activate to act")  # first: nothing is published after the holds
        self._stop_acting("deactivated")
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        self._entered("unconfigured", "cleaned up")
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._entered("finalized", "shut down")
        self._stop_acting("shut down")
        self._release()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._entered("unconfigured", "lifecycle error")
        self._stop_acting("lifecycle error")
        self._release()
        return TransitionCallbackReturn.SUCCESS

    def autostart(self) -> bool:
        """Configure and activate, as a lifecycle manager would; False (the reason in `failure`) if configure
        failed."""
        self._autostarting = True
        try:
            if self.trigger_configure() != TransitionCallbackReturn.SUCCESS:
                return False
        finally:
            self._autostarting = False
        return self.trigger_activate() == TransitionCallbackReturn.SUCCESS

    def close(self) -> None:
        """At process exit (after the executor has stopped, before destroy_node): no longer active (so a worker's
        chunk finishing now is not published after the holds), hold, then stop the threads."""
        self._entered("finalized", "shut down")
        self._stop_acting("shut down")
        self._release()

    def _flush(self, seconds: float) -> None:
        """Wait, `seconds` at most in all, until every reliable subscriber has acknowledged what the node published:
        the holds just sent must not go with the publishers destroyed next (a lost exit hold left a controller on
        the last plan)."""
        deadline = time.monotonic() + seconds
        for publisher in self.publishers:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            publisher.wait_for_all_acked(Duration(nanoseconds=int(left * 1e9)))

    def _owned(self) -> list:
        return [*self.subscriptions, *self.publishers]

    def _release(self) -> None:
        self._release_engine()
        self._flush(FLUSH_S)
        for entity in {id(e): e for e in self._entities}.values():
            if isinstance(entity, Subscription):
                self.destroy_subscription(entity)
            else:
                self.destroy_publisher(entity)
        self._entities = []


def main(node_class: type[ManagedNode], name: str, argv: Sequence[str]) -> int:
    """Run a managed node as a process: a bad parameter or a failed autostart is one FATAL line and exit 1; a
    callback or worker that raised is exit 1 after the node stopped; SIGINT/SIGTERM exit 0, every group held."""
    logger = rclpy.logging.get_logger(name)
    with ros_process(name, list(argv)) as (context, stop):
        try:
            node = node_class(context=context)
        except ParameterError as err:
            logger.fatal(f"cannot start: {err}")
            return 1
        if node.autostart_param and not node.autostart():
            logger.fatal(f"cannot start: {node.failure}")
            node.destroy_node()
            return 1
        with spinning(node, stop, before_destroy=node.close) as spinner:
            stop.wait()
        failure = spinner.failure or node.worker_error
        if failure is not None:
            logger.fatal(f"a callback or worker raised {type(failure).__name__}: {failure}")
            return 1
        return 0
