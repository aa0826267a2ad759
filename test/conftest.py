"""Shared test setup: ROS 2 isolation (log dir, localhost-only discovery, a private DDS domain per test)."""

import os
import random
import tempfile

import pytest

from engine_fixtures import tokenizer  # noqa: F401 - the fixture, for every test here

# Set before any test imports rclpy: logs go to a temp dir, discovery stays on this machine.
os.environ.setdefault("ROS_LOG_DIR", tempfile.mkdtemp(prefix="oxygen_ros_test_logs_"))
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
os.environ.setdefault("HOME", tempfile.gettempdir())

_used_domains: set[int] = set()


@pytest.fixture
def ros_domain_id() -> int:
    """A DDS domain no other test of this run uses (random, so parallel runs on one machine rarely meet)."""
    while True:
        domain = random.randint(1, 200)
        if domain not in _used_domains:
            _used_domains.add(domain)
            return domain


@pytest.fixture
def ros_env(ros_domain_id) -> dict:
    """Environment for child processes that must share the test's DDS domain."""
    env = dict(os.environ)
    env["ROS_DOMAIN_ID"] = str(ros_domain_id)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def ros_context(ros_domain_id):
    """An initialized rclpy context of its own on the test's domain, shut down afterwards."""
    import rclpy

    context = rclpy.Context()
    rclpy.init(context=context, domain_id=ros_domain_id)
    yield context
    context.try_shutdown()
