"""Distributed actors: the one actor loop and the backends that move its data; workers that
fill a replay buffer wrap any of them."""

from maze_cli.parallel.distributed_actors import DistributedActors
from maze_cli.parallel.supervision import ActorFailure
from maze_cli.parallel.sequential import SequentialDistributedActors
from maze_cli.parallel.subproc import SubprocDistributedActors
from maze_cli.parallel.workers_with_buffer import (
    BaseDistributedWorkersWithBuffer,
    SampledBatch,
    initial_sampling_policy_or_random,
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
    "SampledBatch",
    "SequentialDistributedActors",
    "SubprocDistributedActors",
    "initial_sampling_policy_or_random",
]
