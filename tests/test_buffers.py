"""Replay buffers: wrap-around, sampling distributions, importance weights, seeding, memory."""

import numpy as np
import pytest
import torch

from maze_cli.buffers import SumTree, make_replay_buffer
from maze_cli.records import TensorSpec

SPECS = {"x": TensorSpec((), torch.int64), "obs/obs": TensorSpec((3,), torch.float32)}
CHI2_CRIT_P001 = {3: 16.27, 9: 27.88}  # chi-square critical values at p = 0.001


def items(values):
    values = torch.as_tensor(values, dtype=torch.int64)
    return {"x": values, "obs/obs": values.float().unsqueeze(1).repeat(1, 3)}


def chi_square(counts, expected):
    return float(((counts - expected) ** 2 / expected).sum())


def test_wrap_around_at_capacity_overwrites_the_oldest():
    buffer = make_replay_buffer("uniform", 5, SPECS, seed=0)
    buffer.add(items([0, 1, 2]))
    buffer.add(items([3, 4, 5, 6]))
    assert len(buffer) == 5 and buffer.added == 7
    assert sorted(buffer.storage["x"].tolist()) == [2, 3, 4, 5, 6]
    assert buffer.storage["x"].tolist() == [5, 6, 2, 3, 4]
    assert buffer.next_index == 2


def test_uniform_sampling_is_close_to_uniform():
    buffer = make_replay_buffer("uniform", 10, SPECS, seed=1)
    buffer.add(items(range(10)))
    draws = np.concatenate([buffer.sample(100)[0]["x"].numpy() for _ in range(1000)])
    counts = np.bincount(draws, minlength=10)
    assert chi_square(counts, np.full(10, len(draws) / 10)) < CHI2_CRIT_P001[9]


def test_uniform_samples_only_what_was_stored():
    buffer = make_replay_buffer("uniform", 100, SPECS, seed=1)
    buffer.add(items([7, 8, 9]))
    assert set(buffer.sample(500)[0]["x"].tolist()) == {7, 8, 9}


def test_prioritized_sampling_is_proportional_to_priority():
    buffer = make_replay_buffer("prioritized", 4, SPECS, seed=2, alpha=1.0, eps=1e-12)
    indices = buffer.add(items([0, 1, 2, 3]))
    buffer.update_priorities(indices, np.array([1.0, 2.0, 3.0, 4.0]))
    draws = np.concatenate([buffer.sample(64)[0]["x"].numpy() for _ in range(2000)])
    counts = np.bincount(draws, minlength=4)
    expected = len(draws) * np.array([1, 2, 3, 4]) / 10
    assert chi_square(counts, expected) < CHI2_CRIT_P001[3]


def test_alpha_flattens_priorities():
    buffer = make_replay_buffer("prioritized", 2, SPECS, seed=3, alpha=0.5, eps=1e-12)
    buffer.update_priorities(buffer.add(items([0, 1])), np.array([1.0, 4.0]))
    draws = np.concatenate([buffer.sample(50)[0]["x"].numpy() for _ in range(2000)])
    # p^alpha: 1 and 2, so item 1 is drawn 2/3 of the time
    assert abs(draws.mean() - 2 / 3) < 0.01


def test_importance_weights_follow_the_formula():
    beta = 0.4
    buffer = make_replay_buffer("prioritized", 4, SPECS, seed=4, alpha=1.0, beta=beta, beta_final=beta, eps=1e-12)
    buffer.update_priorities(buffer.add(items([0, 1, 2, 3])), np.array([1.0, 2.0, 3.0, 4.0]))
    batch, indices, weights = buffer.sample(256)
    probs = (indices + 1) / 10.0
    raw = (4 * probs) ** -beta
    np.testing.assert_allclose(weights.numpy(), raw / raw.max(), rtol=1e-5)
    assert torch.equal(batch["x"], torch.from_numpy(indices))


def test_beta_is_annealed_to_its_final_value():
    buffer = make_replay_buffer("prioritized", 4, SPECS, seed=4, beta=0.4, beta_final=1.0, beta_anneal_samples=10)
    buffer.add(items([0, 1, 2, 3]))
    assert buffer.sampler.beta == pytest.approx(0.4)
    for _ in range(5):
        buffer.sample(2)
    assert buffer.sampler.beta == pytest.approx(0.7)
    for _ in range(10):
        buffer.sample(2)
    assert buffer.sampler.beta == pytest.approx(1.0)


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_same_seed_same_samples(kind):
    def draws(seed):
        buffer = make_replay_buffer(kind, 50, SPECS, seed=seed)
        buffer.add(items(range(50)))
        return [buffer.sample(8)[0]["x"].tolist() for _ in range(5)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_sum_tree_finds_the_leaf_of_each_prefix_sum():
    rng = np.random.default_rng(0)
    tree = SumTree(37)
    priorities = rng.uniform(0.1, 5.0, 37)
    tree.update(np.arange(37), priorities)
    tree.update(np.array([3, 3, 10]), np.array([0.5, 0.5, 7.0]))  # repeated indices are fine
    priorities[3], priorities[10] = 0.5, 7.0
    assert tree.total == pytest.approx(priorities.sum())
    values = rng.uniform(0, priorities.sum(), 1000)
    expected = np.searchsorted(np.cumsum(priorities), values, side="right")
    np.testing.assert_array_equal(tree.find(values), expected)


def test_memory_of_a_million_pendulum_transitions_follows_from_the_shapes():
    obs = TensorSpec((3,), torch.float32)
    specs = {"obs/obs": obs, "next_obs/obs": obs, "action": TensorSpec((1,), torch.float32),
             "reward": TensorSpec((), torch.float32), "terminated": TensorSpec((), torch.bool)}
    buffer = make_replay_buffer("uniform", 1_000_000, specs, seed=0)
    assert buffer.nbytes == 1_000_000 * (3 * 4 + 3 * 4 + 4 + 4 + 1)  # 33 MB
