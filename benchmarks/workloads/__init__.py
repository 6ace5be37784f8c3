"""Benchmark workloads. Each module defines its Dataset at module level (so it pickles for
spawned workers) and `run(ctx) -> list[record]`."""

NAMES = (
    "tiny", "jpeg", "remote_get", "stragglers", "startup", "paths_memory", "paths_memory_shared",
    "spawn_array", "packed", "per_sample", "image_path", "vision",
)
