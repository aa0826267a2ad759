"""How every executable of this package starts and stops rclpy, in one place.

Each process gets its own `rclpy.Context` (so tests can run nodes in-process side by side), SIGINT/SIGTERM set a
stop event instead of raising inside a callback (the process's own, from `entry`, when it started through it),
and shutdown runs in the order that never aborts the process:
executor, spin thread, node-specific cleanup, node, context (a spin thread left running makes rclpy abort with
`terminate called without an active exception`).
"""

from __future__ import annotations

import gc
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions

from .entry import process_stop


@contextmanager
def ros_process(name: str, argv: Sequence[str]) -> Iterator[tuple[rclpy.Context, threading.Event]]:
    """rclpy initialized from `argv` (its `--ros-args` part) in a context of its own; yields (context, stop).

    `stop` is the process's stop event when `entry.run` started it (its handlers then stay to the end); otherwise
    (a node's main called in-process) SIGINT/SIGTERM set a new event until the block ends.
    """
    stop = process_stop()
    previous = {}
    if stop is None:
        stop = threading.Event()
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    context = rclpy.Context()
    try:
        rclpy.init(args=[name, *argv], context=context, signal_handler_options=SignalHandlerOptions.NO)
        yield context, stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        context.try_shutdown()
        # Shutdown alone keeps the context's DDS participant (and its busy threads) alive until the context is
        # destroyed, which waits for its nodes; a node whose constructor raised is only freed by the collector.
        # A process ends here anyway; a node's main called in a test's process does not.
        gc.collect()
        context.destroy()


class Spinner:
    """A node spinning on a SingleThreadedExecutor in a background thread (see `spinning`)."""

    def __init__(self, node: Node, stop: threading.Event | None):
        self.executor = SingleThreadedExecutor(context=node.context)
        self.executor.add_node(node)
        self.stop = stop
        self.failure: BaseException | None = None  # what a callback raised, if one did
        self.thread = threading.Thread(target=self._spin, name=f"{node.get_name()}-spin", daemon=True)

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except ExternalShutdownException:
            pass
        except BaseException as error:  # a callback raised: the owner reports it from the main thread
            self.failure = error
        finally:
            if self.stop is not None:
                self.stop.set()


@contextmanager
def spinning(node: Node, stop: threading.Event | None = None,
             before_destroy: Callable[[], None] | None = None) -> Iterator[Spinner]:
    """Spin `node` in a background thread for the duration of the block.

    The single-threaded executor keeps timers on time on small machines, where the multi-threaded one stalls. If
    a callback raises, spinning ends, `stop` is set and the error is kept in `Spinner.failure`. `before_destroy`
    runs after spinning stopped and before the node is destroyed (e.g. joining worker threads that still publish
    through the node).
    """
    spinner = Spinner(node, stop)
    spinner.thread.start()
    try:
        yield spinner
    finally:
        spinner.executor.shutdown()
        spinner.thread.join()
        if before_destroy is not None:
            before_destroy()
        node.destroy_node()


def spin_until_stopped(node: Node, stop: threading.Event) -> None:
    """Spin `node` in the calling thread until `stop` is set, then destroy it.

    For nodes whose callbacks use objects bound to the thread that made them (the recorder's sqlite3 bag writer).
    """
    executor = SingleThreadedExecutor(context=node.context)
    executor.add_node(node)
    try:
        while not stop.is_set():
            executor.spin_once(timeout_sec=0.1)
    finally:
        executor.shutdown()
        node.destroy_node()
