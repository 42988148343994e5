"""Distributed actors: the one actor loop and the backends that move its data."""

from maze_cli.parallel.distributed_actors import ActorFailure, DistributedActors
from maze_cli.parallel.sequential import SequentialDistributedActors
from maze_cli.parallel.subproc import SubprocDistributedActors
from maze_cli.parallel.workers_with_buffer import (
    BaseDistributedWorkersWithBuffer,
    RayDistributedWorkersWithBuffer,
    SampledBatch,
    SequentialDistributedWorkersWithBuffer,
    SubprocDistributedWorkersWithBuffer,
)


def __getattr__(name: str):
    # RayDistributedActors imports Ray only when asked for: Ray is an optional extra.
    if name == "RayDistributedActors":
        from maze_cli.parallel.ray_backend import RayDistributedActors

        return RayDistributedActors
    raise AttributeError(name)


__all__ = [
    "ActorFailure",
    "BaseDistributedWorkersWithBuffer",
    "DistributedActors",
    "RayDistributedActors",
    "RayDistributedWorkersWithBuffer",
    "SampledBatch",
    "SequentialDistributedActors",
    "SequentialDistributedWorkersWithBuffer",
    "SubprocDistributedActors",
    "SubprocDistributedWorkersWithBuffer",
]
