"""Replay buffers: storage + writer + sampler (uniform or prioritized), seeded, built by `_target_`."""

from maze_cli.buffers.replay_buffer import PrioritizedReplayBuffer, ReplayBuffer, UniformReplayBuffer
from maze_cli.buffers.samplers import PrioritizedSampler, Sampler, UniformSampler
from maze_cli.buffers.storage import TensorStorage
from maze_cli.buffers.sum_tree import SumTree
from maze_cli.buffers.writer import CircularWriter

__all__ = [
    "CircularWriter", "PrioritizedReplayBuffer", "PrioritizedSampler", "ReplayBuffer", "Sampler", "SumTree",
    "TensorStorage", "UniformReplayBuffer", "UniformSampler",
]
