"""Replay buffers: storage + writer + sampler (uniform or prioritized), seeded."""

from maze_cli.buffers.replay_buffer import PrioritizedSampler, ReplayBuffer, UniformSampler, make_replay_buffer
from maze_cli.buffers.sum_tree import SumTree

__all__ = ["PrioritizedSampler", "ReplayBuffer", "SumTree", "UniformSampler", "make_replay_buffer"]
