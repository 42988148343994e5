"""Distributed actors: the one actor loop and the backends that move its data."""

from maze_cli.parallel.distributed_actors import ActorFailure, DistributedActors
from maze_cli.parallel.sequential import SequentialDistributedActors
from maze_cli.parallel.subproc import SubprocDistributedActors
from maze_cli.parallel.workers_with_buffer import (
    BaseDistributedWorkersWithBuffer,
    SampledBatch,
    SequentialDistributedWorkersWithBuffer,
    SubprocDistributedWorkersWithBuffer,
)

__all__ = [
    "ActorFailure",
    "BaseDistributedWorkersWithBuffer",
    "DistributedActors",
    "SampledBatch",
    "SequentialDistributedActors",
    "SequentialDistributedWorkersWithBuffer",
    "SubprocDistributedActors",
    "SubprocDistributedWorkersWithBuffer",
]
