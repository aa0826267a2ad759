"""The fleet on Ray Serve: a pool of replicas of the engine's multi-robot server, routed by the fleet placement
(docs/ray.md)."""
