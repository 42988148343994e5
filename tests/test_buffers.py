"""Replay buffers: wrap-around, sampling distributions, importance weights, seeding, memory,
checkpoints that `torch.load(weights_only=True)` reads, construction from a `_target_` config."""

import functools

import numpy as np
import pytest
import torch
from hydra.utils import instantiate

from maze_cli.buffers import (CircularWriter, PrioritizedReplayBuffer, PrioritizedSampler, ReplayBuffer, Sampler,
                              SumTree, TensorStorage, UniformReplayBuffer, UniformSampler)
from maze_cli.records import TensorSpec

SPECS = {"x": TensorSpec((), torch.int64), "obs/obs": TensorSpec((3,), torch.float32)}
CHI2_CRIT_P001 = {3: 16.27, 9: 27.88}  # chi-square critical values at p = 0.001


def items(values):
    values = torch.as_tensor(values, dtype=torch.int64)
    return {"x": values, "obs/obs": values.float().unsqueeze(1).repeat(1, 3)}


def chi_square(counts, expected):
    return float(((counts - expected) ** 2 / expected).sum())


def save_and_load(state, path):
    """`state` as a checkpoint writes and a resume reads it: numpy objects in it would fail here."""
    torch.save(state, path)
    return torch.load(path, weights_only=True)


def test_wrap_around_at_capacity_overwrites_the_oldest():
    buffer = UniformReplayBuffer(5, SPECS, seed=0)
    buffer.add(items([0, 1, 2]))
    buffer.add(items([3, 4, 5, 6]))
    assert len(buffer) == 5 and buffer.added == 7
    assert sorted(buffer.storage["x"].tolist()) == [2, 3, 4, 5, 6]
    assert buffer.storage["x"].tolist() == [5, 6, 2, 3, 4]
    assert buffer.next_index == 2


def test_circular_writer_hands_out_slots_after_the_newest():
    writer = CircularWriter(4)
    assert writer.claim(3).tolist() == [0, 1, 2]
    assert writer.claim(3).tolist() == [3, 0, 1]
    assert (writer.next_index, writer.size, writer.added) == (2, 4, 6)


def test_storage_writes_and_reads_the_given_slots():
    storage = TensorStorage(4, SPECS)
    storage.write(np.array([3, 1]), items([10, 11]))
    assert storage.read(np.array([1, 3, 1]))["x"].tolist() == [11, 10, 11]
    assert storage.read(np.array([3]))["obs/obs"].tolist() == [[10.0, 10.0, 10.0]]


def test_uniform_sampling_is_close_to_uniform():
    buffer = UniformReplayBuffer(10, SPECS, seed=1)
    buffer.add(items(range(10)))
    draws = np.concatenate([buffer.sample(100)[0]["x"].numpy() for _ in range(1000)])
    counts = np.bincount(draws, minlength=10)
    assert chi_square(counts, np.full(10, len(draws) / 10)) < CHI2_CRIT_P001[9]


def test_uniform_samples_only_what_was_stored():
    buffer = UniformReplayBuffer(100, SPECS, seed=1)
    buffer.add(items([7, 8, 9]))
    assert set(buffer.sample(500)[0]["x"].tolist()) == {7, 8, 9}


def test_prioritized_sampling_is_proportional_to_priority():
    buffer = PrioritizedReplayBuffer(4, SPECS, seed=2, alpha=1.0, eps=1e-12)
    indices = buffer.add(items([0, 1, 2, 3]))
    buffer.update_priorities(indices, np.array([1.0, 2.0, 3.0, 4.0]))
    draws = np.concatenate([buffer.sample(64)[0]["x"].numpy() for _ in range(2000)])
    counts = np.bincount(draws, minlength=4)
    expected = len(draws) * np.array([1, 2, 3, 4]) / 10
    assert chi_square(counts, expected) < CHI2_CRIT_P001[3]


def test_alpha_flattens_priorities():
    buffer = PrioritizedReplayBuffer(2, SPECS, seed=3, alpha=0.5, eps=1e-12)
    buffer.update_priorities(buffer.add(items([0, 1])), np.array([1.0, 4.0]))
    draws = np.concatenate([buffer.sample(50)[0]["x"].numpy() for _ in range(2000)])
    # p^alpha: 1 and 2, so item 1 is drawn 2/3 of the time
    assert abs(draws.mean() - 2 / 3) < 0.01


def test_importance_weights_follow_the_formula():
    beta = 0.4
    buffer = PrioritizedReplayBuffer(4, SPECS, seed=4, alpha=1.0, beta=beta, beta_final=beta, eps=1e-12)
    buffer.update_priorities(buffer.add(items([0, 1, 2, 3])), np.array([1.0, 2.0, 3.0, 4.0]))
    batch, indices, weights = buffer.sample(256)
    probs = (indices + 1) / 10.0
    raw = (4 * probs) ** -beta
    np.testing.assert_allclose(weights.numpy(), raw / raw.max(), rtol=1e-5)
    assert weights.dtype == torch.float32
    assert torch.equal(batch["x"], torch.from_numpy(indices))


def test_beta_is_annealed_to_its_final_value():
    buffer = PrioritizedReplayBuffer(4, SPECS, seed=4, beta=0.4, beta_final=1.0, beta_anneal_samples=10)
    buffer.add(items([0, 1, 2, 3]))
    assert buffer.sampler.beta == pytest.approx(0.4)
    for _ in range(5):
        buffer.sample(2)
    assert buffer.sampler.beta == pytest.approx(0.7)
    for _ in range(10):
        buffer.sample(2)
    assert buffer.sampler.beta == pytest.approx(1.0)


@pytest.mark.parametrize("buffer_class", [UniformReplayBuffer, PrioritizedReplayBuffer])
def test_same_seed_same_samples(buffer_class):
    def draws(seed):
        buffer = buffer_class(50, SPECS, seed=seed)
        buffer.add(items(range(50)))
        return [buffer.sample(8)[0]["x"].tolist() for _ in range(5)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


@pytest.mark.parametrize("buffer_class", [UniformReplayBuffer, PrioritizedReplayBuffer])
def test_a_checkpointed_buffer_samples_on_as_the_original(buffer_class, tmp_path):
    original = buffer_class(16, SPECS, seed=5)
    original.add(items(range(20)))  # wrapped: the writer's position matters
    for _ in range(3):  # advance the generator and, for prioritized, beta's annealing
        _, indices, _ = original.sample(4)
        original.update_priorities(indices, np.linspace(0.1, 3.0, 4))
    resumed = buffer_class(16, SPECS, seed=99)  # another seed: only the checkpoint can make them agree
    resumed.load_state_dict(save_and_load(original.state_dict(), tmp_path / "buffer.pt"))

    assert (len(resumed), resumed.next_index, resumed.added) == (len(original), original.next_index, original.added)
    assert torch.equal(resumed.storage["x"], original.storage["x"])
    for step in range(5):
        (batch, indices, weights), (batch_r, indices_r, weights_r) = original.sample(8), resumed.sample(8)
        np.testing.assert_array_equal(indices_r, indices)
        assert torch.equal(weights_r, weights) and torch.equal(batch_r["x"], batch["x"])
        for buffer in (original, resumed):
            buffer.update_priorities(indices, np.full(8, step + 0.5))
            buffer.add(items([100 + step]))
    assert torch.equal(resumed.storage["x"], original.storage["x"])


def test_a_bit_generator_holding_numpy_arrays_is_checkpointed_as_plain_values(tmp_path):
    sampler, resumed = UniformSampler(seed=0), UniformSampler(seed=1)
    sampler.rng = np.random.Generator(np.random.MT19937(3))  # its state holds a numpy array
    resumed.rng = np.random.Generator(np.random.MT19937(4))
    resumed.load_state_dict(save_and_load(sampler.state_dict(), tmp_path / "sampler.pt"))
    np.testing.assert_array_equal(resumed.sample(10, 1000)[0], sampler.sample(10, 1000)[0])


def test_a_checkpoint_of_another_capacity_is_refused():
    small = PrioritizedReplayBuffer(4, SPECS, seed=0)
    small.add(items([1, 2]))
    with pytest.raises(ValueError, match="capacity 4.*8"):
        PrioritizedReplayBuffer(8, SPECS, seed=0).load_state_dict(small.state_dict())


def test_any_sampler_composes_with_the_buffer():
    class NewestFirst(Sampler):
        """Draws the most recently written slots: a rule the buffer knows nothing about."""

        def __init__(self):
            self.newest = np.zeros(0, dtype=np.int64)

        def on_add(self, indices):
            self.newest = indices

        def sample(self, n, size):
            return self.newest[-n:], np.full(n, 0.5, dtype=np.float32)

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    buffer = ReplayBuffer(8, SPECS, NewestFirst())
    buffer.add(items([1, 2, 3, 4]))
    batch, _, weights = buffer.sample(2)
    assert batch["x"].tolist() == [3, 4] and weights.tolist() == [0.5, 0.5]
    with pytest.raises(TypeError):
        Sampler()


def test_buffers_are_built_from_a_target_config():
    # as the packaged replay_buffer configs are instantiated: partially, item_specs supplied by the workers
    config = {"_target_": "maze_cli.buffers.PrioritizedReplayBuffer", "_partial_": True, "capacity": 8, "seed": 0,
              "alpha": 1.0, "beta": 0.5}
    buffer = instantiate(config)(item_specs=SPECS)
    assert isinstance(buffer, PrioritizedReplayBuffer) and buffer.capacity == 8
    assert (buffer.sampler.alpha, buffer.sampler.beta) == (1.0, 0.5)
    uniform = functools.partial(UniformReplayBuffer, capacity=3, seed=1)(item_specs=SPECS)
    assert isinstance(uniform.sampler, UniformSampler) and uniform.storage["obs/obs"].shape == (3, 3)


@pytest.mark.parametrize("bad, name", [
    ({"capacity": 0}, "capacity"), ({"capacity": 2.5}, "capacity"), ({"capacity": True}, "capacity"),
    ({"seed": -1}, "seed"), ({"alpha": -0.1}, "alpha"), ({"beta": 1.5}, "beta"), ({"beta_final": -1.0}, "beta_final"),
    ({"beta_anneal_samples": 0}, "beta_anneal_samples"), ({"eps": 0.0}, "eps"), ({"item_specs": {}}, "item_specs"),
])
def test_bad_arguments_fail_with_their_name(bad, name):
    arguments = {"capacity": 4, "item_specs": SPECS, "seed": 0, **bad}
    with pytest.raises(ValueError, match=rf"^{name} must"):
        PrioritizedReplayBuffer(**arguments)


def test_a_sampler_of_another_capacity_or_kind_is_refused():
    with pytest.raises(ValueError, match="capacity 5.*4"):
        ReplayBuffer(4, SPECS, PrioritizedSampler(5, seed=0))
    with pytest.raises(TypeError, match="Sampler"):
        ReplayBuffer(4, SPECS, np.random.default_rng(0))


def test_malformed_items_fail_with_the_field_name():
    buffer = UniformReplayBuffer(4, SPECS, seed=0)
    with pytest.raises(ValueError, match="obs/obs"):
        buffer.add({"x": torch.zeros(2, dtype=torch.int64)})
    with pytest.raises(ValueError, match="leading dimension"):
        buffer.add({"x": torch.zeros(2, dtype=torch.int64), "obs/obs": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match="empty"):
        buffer.sample(1)


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
    buffer = UniformReplayBuffer(1_000_000, specs, seed=0)
    assert buffer.nbytes == 1_000_000 * (3 * 4 + 3 * 4 + 4 + 4 + 1)  # 33 MB
