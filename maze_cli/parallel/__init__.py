"""Distributed actors: the one actor loop and the backends that move its data."""

from maze_cli.parallel.distributed_actors import ActorFailure, DistributedActors
from maze_cli.parallel.sequential import SequentialDistributedActors
from maze_cli.parallel.subproc import SubprocDistributedActors

__all__ = ["ActorFailure", "DistributedActors", "SequentialDistributedActors", "SubprocDistributedActors"]
