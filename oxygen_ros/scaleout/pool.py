"""Bringing the pool up on a Ray cluster and down again: the controller actor, Serve's HTTP proxy on the head node,
the application (`deployments.build_app`), and the wait until every replica answers the controller's probe."""

import time
from dataclasses import dataclass, field

import ray
from ray import serve

from ..fleet.specs import ModelSpec
from .deployments import APP, build_app, replica_names, start_controller


@dataclass(frozen=True)
class PoolConfig:
    models: tuple[str, ...]  # model specs, id=source[:seed]
    embodiment: str = "droid"
    replicas: int = 2
    max_robots_per_replica: int = 8
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_batch: int = 8
    threads: int = 1  # CPU cores (intra-op threads) per replica
    replica_options: tuple[dict, ...] = ()  # Ray actor options per slot (e.g. resources pinning it to a node)
    ingress_options: dict = field(default_factory=dict)
    controller_options: dict = field(default_factory=dict)

    def __post_init__(self):
        """ValueError for a configuration no pool can have (checked before any Ray work)."""
        if self.replicas < 1 or self.max_robots_per_replica < 1 or self.threads < 1:
            raise ValueError("--replicas, --max-robots-per-replica and --threads must be >= 1")
        model_ids = [ModelSpec.parse(text).model_id for text in self.models]
        if not model_ids or len(set(model_ids)) != len(model_ids):
            raise ValueError(f"--models must name distinct models, got {model_ids}")
        if self.replica_options and len(self.replica_options) != self.replicas:
            raise ValueError("replica_options must name every replica")

    @property
    def model_ids(self) -> list[str]:
        return [ModelSpec.parse(text).model_id for text in self.models]


def start_pool(config: PoolConfig, ready_timeout_s: float = 300.0):
    """Deploy the pool on the Ray cluster this process is connected to; returns the controller actor once every
    replica answers (TimeoutError when they do not come up)."""
    names = replica_names(config.replicas)
    controller = start_controller(names, config.model_ids, config.max_robots_per_replica, config.controller_options)
    serve.start(http_options={"host": config.host, "port": config.port}, proxy_location="HeadOnly")
    serve.run(build_app(list(config.models), config.embodiment, config.replicas, config.api_key, config.max_batch,
                        config.threads, list(config.replica_options) or None, config.ingress_options),
              name=APP, route_prefix="/")
    deadline = time.monotonic() + ready_timeout_s
    while sorted(ray.get(controller.status.remote())["alive"]) != names:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the replicas did not all answer within {ready_timeout_s:g} s")
        time.sleep(0.2)
    return controller


def stop_pool(controller) -> None:
    """Delete the application and the controller (the cluster and Serve's own actors stay)."""
    serve.delete(APP)
    ray.kill(controller)
