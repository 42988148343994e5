"""Action masks (maze_cli/envs/action_mask.py): forbidden actions get probability zero in every use of
the distribution, for every algorithm with discrete actions; bad mask configs are one line."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from maze_cli.algorithms.dqn import DqnPolicy
from maze_cli.algorithms.returns import gae, value_forced_steps, vtrace
from maze_cli.algorithms.sac import SacPolicy
from maze_cli.envs.action_mask import LegalActionCheck, VectorLegalActionCheck, apply_mask, find_mask_key
from maze_cli.envs.factory import EnvFactory
from maze_cli.envs.masked_choice import MaskedChoice
from maze_cli.errors import ConfigError
from maze_cli.policies.actor_critic import ActorCritic
from maze_cli.policies.distributions import Categorical, MultiCategorical
from tests.cli import run_train
from tests.test_checkpoints import rollout
from tests.test_cli_errors import assert_one_line_error
from tests.test_train import read_stats

NETWORK = {"_target_": "maze_cli.policies.mlp.MlpNetwork", "hidden_sizes": [16], "activation": "tanh"}


def _masks(n: int, batch: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(batch, n, generator=g) < 0.4).to(torch.int8)
    mask[torch.arange(batch), torch.randint(n, (batch,), generator=g)] = 1  # at least one legal
    return mask


def test_a_masked_categorical_never_samples_scores_or_picks_a_forbidden_action():
    torch.manual_seed(0)
    logits = torch.randn(256, 6, requires_grad=True)
    mask = _masks(6, 256)
    masked = apply_mask(logits, mask)
    dist = Categorical(6)
    for _ in range(20):
        actions, logp = dist.sample_with_log_prob(masked)
        assert mask.gather(1, actions[:, None]).all()
        assert torch.allclose(logp, dist.log_prob(masked, actions))
    assert mask.gather(1, dist.mode(masked)[:, None]).all()
    probs = dist.log_prob(masked[:, None, :].expand(-1, 6, -1), torch.arange(6).expand(256, -1)).exp()
    assert (probs[mask == 0] == 0).all() and torch.allclose(probs.sum(-1), torch.ones(256))
    # the entropy is that of the legal actions' softmax alone, finite
    legal_entropy = torch.stack([torch.distributions.Categorical(logits=logits[i][mask[i] == 1]).entropy() for i in range(256)])
    assert torch.allclose(dist.entropy(masked), legal_entropy, atol=1e-5)
    dist.entropy(masked).sum().backward()
    assert (logits.grad[mask == 0] == 0).all() and logits.grad[mask == 1].abs().sum() > 0


def test_a_masked_multicategorical_masks_each_choice_apart():
    nvec = [3, 4]
    mask = torch.cat([_masks(3, 128, 1), _masks(4, 128, 2)], dim=-1)
    masked = apply_mask(torch.randn(128, 7), mask)
    actions, _ = MultiCategorical(nvec).sample_with_log_prob(masked)
    assert mask[:, :3].gather(1, actions[:, :1]).all() and mask[:, 3:].gather(1, actions[:, 1:]).all()


def _choice_batch(batch: int) -> dict[str, torch.Tensor]:
    mask = _masks(8, batch)
    return {"obs": mask.float(), "action_mask": mask}


@pytest.mark.parametrize("policy", ["actor_critic", "dqn", "sac"])
def test_every_discrete_policy_acts_within_the_mask_sampled_and_greedy(policy):
    torch.manual_seed(1)
    spaces = MaskedChoice().observation_space, gym.spaces.Discrete(8)
    if policy == "actor_critic":
        net = ActorCritic(*spaces, NETWORK, action_mask_key="action_mask")
    elif policy == "dqn":
        net = DqnPolicy(*spaces, NETWORK, action_mask_key="action_mask")  # epsilon 1 at the start: all random
    else:
        net = SacPolicy(*spaces, NETWORK, action_mask_key="action_mask")
    obs = _choice_batch(512)
    for deterministic in (False, True):
        actions, _, _ = net.act(obs, net.initial_state(512), torch.ones(512, dtype=torch.bool), deterministic=deterministic)
        assert obs["action_mask"].gather(1, actions[:, None]).all(), deterministic
    if policy == "dqn":
        q = net.q(obs)
        assert (q[obs["action_mask"] == 0] < -1e8).all() and (q[obs["action_mask"] == 1] > -1e8).all()
    if policy == "actor_critic":  # the learner's forward over [T, B] sees the same mask
        time_major = {k: v.reshape(4, 128, 8) for k, v in obs.items()}
        params = net(time_major, (), torch.zeros(4, 128, dtype=torch.bool)).params
        assert (params[time_major["action_mask"] == 0] < -1e8).all()


@pytest.mark.parametrize("action_space", [gym.spaces.Discrete(8), gym.spaces.MultiDiscrete([3, 5])])
def test_the_learner_skips_steps_with_one_legal_action_and_gets_the_same_loss_and_gradients(action_space):
    """A step whose mask leaves one action (a seat that passes) has log-prob 0 and entropy 0 whatever the
    policy network says: the learner's forward leaves it out of that network, and nothing else changes."""
    torch.manual_seed(2)
    T, B = 4, 64
    mask = _masks(8, T * B, seed=3)
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        mask = torch.cat([_masks(3, T * B, 4), _masks(5, T * B, 5)], dim=-1)
    forced = torch.rand(T * B) < 0.5
    parts = [(0, 8)] if isinstance(action_space, gym.spaces.Discrete) else [(0, 3), (3, 8)]
    for start, end in parts:  # a forced step: exactly one legal action in each part
        mask[forced, start:end] = 0
        mask[forced, start] = 1
    forced |= (mask != 0).sum(-1) == len(parts)  # random masks that happen to leave one action
    obs = {"obs": torch.randn(T, B, 8), "action_mask": mask.reshape(T, B, 8)}
    space = gym.spaces.Dict({"obs": gym.spaces.Box(-10, 10, (8,)), "action_mask": gym.spaces.MultiBinary(8)})
    net = ActorCritic(space, action_space, NETWORK, action_mask_key="action_mask")
    seen = []
    net.network.register_forward_hook(lambda module, args, out: seen.append(args[0]["obs"].shape[:-1]))
    actions = net.distribution.sample_with_log_prob(net(obs).params)[0]

    def loss_and_grads(skip: bool):
        net._n_choices = len(parts) if skip else 0
        net.zero_grad()
        out = net(obs, (), torch.zeros(T, B, dtype=torch.bool))
        dist = net.distribution
        loss = -(dist.log_prob(out.params, actions) * torch.randn(T, B, generator=torch.Generator().manual_seed(0))).mean()
        loss = loss - 0.1 * dist.entropy(out.params).mean() + out.values.pow(2).mean()
        loss.backward()
        return out, loss, [p.grad.clone() for p in net.parameters()]

    seen.clear()
    full_out, full_loss, full_grads = loss_and_grads(skip=False)
    assert seen == [(T, B)]
    seen.clear()
    out, loss, grads = loss_and_grads(skip=True)
    assert seen == [(1, int((~forced).sum()))]  # the policy network saw the steps with a choice only
    assert torch.allclose(loss, full_loss, atol=1e-6)
    assert torch.allclose(out.values, full_out.values)
    logp_forced = net.distribution.log_prob(out.params, actions).reshape(-1)[forced]
    assert (logp_forced == 0).all()
    for g, full in zip(grads, full_grads):
        assert torch.allclose(g, full, atol=1e-6)
    # acting likewise: the same actions from the same random stream, the network on the free steps only
    flat = {k: v.reshape(T * B, -1) for k, v in obs.items()}
    step = net.network.step
    net.network.step = lambda observations, *args: seen.append(observations["obs"].shape[:-1]) or step(observations, *args)
    acted = {}
    for skip in (False, True):
        net._n_choices = len(parts) if skip else 0
        seen.clear()
        torch.manual_seed(7)
        acted[skip] = net.act(flat)[:2]
    assert seen == [(int((~forced).sum()),)]
    assert torch.equal(acted[True][0], acted[False][0]) and torch.allclose(acted[True][1], acted[False][1], atol=1e-6)


def test_the_learner_values_forced_steps_by_their_rewards_and_its_value_network_sees_the_free_steps_alone():
    """PPO's and APPO's learner skip the value network too where a step has one legal action
    (`value_forced=False`): those steps' values are 0 and the others' are what the full pass gives."""
    torch.manual_seed(4)
    T, B = 5, 32
    mask = _masks(6, T * B, seed=6)
    forced = torch.rand(T * B) < 0.5
    mask[forced] = 0
    mask[forced, 0] = 1
    forced |= (mask != 0).sum(-1) == 1
    obs = {"obs": torch.randn(T, B, 8), "action_mask": mask.reshape(T, B, 6)}
    space = gym.spaces.Dict({"obs": gym.spaces.Box(-10, 10, (8,)), "action_mask": gym.spaces.MultiBinary(6)})
    net = ActorCritic(space, gym.spaces.Discrete(6), NETWORK, action_mask_key="action_mask")
    seen = []
    net.value_network.register_forward_hook(lambda module, args, out: seen.append(args[0]["obs"].shape[:-1]))
    full = net(obs)
    assert seen == [(T, B)]
    seen.clear()
    skipped = net(obs, value_forced=False)
    assert seen == [(1, int((~forced).sum()))]
    assert torch.equal(net.valued_steps(obs), ~forced.reshape(T, B))
    assert (skipped.values.reshape(-1)[forced] == 0).all()
    assert torch.allclose(skipped.values.reshape(-1)[~forced], full.values.reshape(-1)[~forced], atol=1e-6)
    assert torch.allclose(skipped.params, full.params, atol=1e-6)
    no_mask = ActorCritic(space, gym.spaces.Discrete(6), NETWORK)
    assert no_mask.valued_steps(obs) is None  # nothing skipped: the learner values every step as before


def _two_seat_rows(T: int, B: int, gamma: float, seed: int):
    """Rows of a two-seat game's seat: free and forced steps alternating from a random phase, episodes
    ending at random, and values that hold the Bellman equation of a forced step exactly."""
    g = torch.Generator().manual_seed(seed)
    phase = torch.randint(2, (B,), generator=g)
    valued = (torch.arange(T + 1).unsqueeze(1) + phase) % 2 == 0  # [T+1, B]
    rewards = torch.randn(T, B, generator=g)
    dones = torch.rand(T, B, generator=g) < 0.15
    discounts = gamma * (~dones).float()
    values = torch.randn(T + 1, B, generator=g)
    for t in range(T - 1, -1, -1):
        values[t] = torch.where(valued[t], values[t], rewards[t] + discounts[t] * values[t + 1])
    return valued, rewards, discounts, values


def test_forced_steps_valued_by_their_rewards_give_the_targets_of_a_value_that_knows_them():
    """Where the rollout's last observation has a choice, GAE and V-trace on the filled values are those of
    the exact values on every step; where it is forced, the row ends at its last step with a choice."""
    T, B, gamma, lam = 9, 64, 0.9, 0.8
    valued, rewards, discounts, exact = _two_seat_rows(T, B, gamma, seed=1)
    forced = value_forced_steps(torch.where(valued, exact, torch.zeros(())), valued, rewards, discounts)
    whole = valued[T]
    assert whole.any() and (~whole).any()
    assert torch.allclose(forced.values[:, whole], exact[:, whole])
    assert forced.kept[:, whole].all()
    logp = torch.randn(T, B, generator=torch.Generator().manual_seed(2)) * 0.1
    logp = torch.where(valued[:T], logp, torch.zeros(()))  # a forced step's log-prob is 0 for every policy
    exact_gae = gae(rewards, exact[:T], exact[T], discounts, lam)
    filled_gae = gae(forced.rewards, forced.values[:T], forced.values[T], forced.discounts, lam)
    assert torch.allclose(filled_gae[:, whole], exact_gae[:, whole], atol=1e-5)
    exact_vs = vtrace(torch.zeros(T, B), logp, rewards, exact[:T], exact[T], discounts).vs
    filled_vs = vtrace(torch.zeros(T, B), logp, forced.rewards, forced.values[:T], forced.values[T], forced.discounts).vs
    assert torch.allclose(filled_vs[:, whole], exact_vs[:, whole], atol=1e-5)
    for b in (~whole).nonzero().squeeze(1).tolist():  # forced x_T: the row as a rollout of L steps, bootstrapped by V(x_L)
        last = int(valued[:T, b].nonzero().max())
        assert forced.kept[:, b].tolist() == [t < last for t in range(T)]
        if last == 0:
            continue
        short = gae(rewards[:last, b:b + 1], exact[:last, b:b + 1], exact[last, b:b + 1], discounts[:last, b:b + 1], lam)
        assert torch.allclose(filled_gae[:last, b:b + 1], short, atol=1e-5)


def test_mask_keys_that_cannot_be_masks_are_refused_naming_the_key_and_the_fix():
    obs, action = MaskedChoice().observation_space, gym.spaces.Discrete(8)
    assert find_mask_key(obs, action, None) == "action_mask"
    assert find_mask_key(obs, action, False) is None
    assert find_mask_key(gym.spaces.Box(0, 1, (3,)), action, None) is None
    with pytest.raises(ConfigError, match=r"action_mask_key=legal: .*no key 'legal'.*\['obs', 'action_mask'\]|action_mask_key=legal: .*no key 'legal'"):
        find_mask_key(obs, action, "legal")
    with pytest.raises(ConfigError, match=r"Box of shape \(5,\)"):
        find_mask_key(obs, gym.spaces.Discrete(5), "action_mask")
    with pytest.raises(ConfigError, match="cannot be masked"):
        find_mask_key(obs, gym.spaces.Box(-1, 1, (8,)), "action_mask")
    wide = gym.spaces.Dict({"action_mask": gym.spaces.Box(-5.0, 5.0, (8,))})
    with pytest.raises(ConfigError, match="values 0"):
        find_mask_key(wide, action, None)
    assert find_mask_key(gym.spaces.Dict({"m": gym.spaces.MultiBinary(7)}), gym.spaces.MultiDiscrete([3, 4]), "m") == "m"


def test_a_wrong_mask_key_is_one_line_before_any_actor_starts(tmp_path):
    result = run_train("+env=masked_choice", "env.action_mask_key=legal", run_dir=tmp_path / "run")
    assert_one_line_error(result, "env.action_mask_key=legal", "'legal'")


class _NoLegalActionAtStep3(MaskedChoice):
    """Fault injection: at its third step the env offers no legal action."""

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(self.best_action())
        if self._t == 3:
            observation["action_mask"][:] = 0
        return observation, reward, terminated, truncated, info


def test_a_mask_without_a_legal_action_is_an_error_that_names_the_step():
    env = LegalActionCheck(_NoLegalActionAtStep3(), "action_mask")
    env.reset(seed=0)
    env.step(0)
    env.step(0)
    with pytest.raises(ValueError, match="episode step 3: the action mask allows no action"):
        env.step(0)


class _VectorizedFaultyChoice:
    """Fault injection: a `_target_` that also builds its envs vectorized (as envpool's do); sub-env
    `faulty` offers no legal action at its third step, the others always do."""

    def __call__(self, faulty: int = 1) -> gym.Env:
        return MaskedChoice()

    def vector_env(self, n_envs: int, faulty: int = 1) -> gym.vector.VectorEnv:
        return gym.vector.SyncVectorEnv([_NoLegalActionAtStep3 if i == faulty else MaskedChoice for i in range(n_envs)])


vectorized_faulty_choice = _VectorizedFaultyChoice()


def test_a_vectorized_env_has_every_mask_checked_and_the_error_names_the_sub_env_and_step():
    factory = EnvFactory({"_target_": f"{__name__}.vectorized_faulty_choice", "faulty": 2})
    vector = factory.vector_env(3)
    assert isinstance(vector, VectorLegalActionCheck)
    vector.reset(seed=0)
    vector.step(np.zeros(3, np.int64))
    vector.step(np.zeros(3, np.int64))
    with pytest.raises(ValueError, match=r"sub-env 2\), episode step 3: the action mask allows no action"):
        vector.step(np.zeros(3, np.int64))
    vector.close()


def test_a_vectorized_env_may_end_an_episode_on_a_mask_without_legal_action():
    """An ended episode's last mask precedes no action (gymnasium's next-step autoreset resets it)."""
    vector = VectorLegalActionCheck(gym.vector.SyncVectorEnv([lambda: MaskedChoice(episode_steps=5)] * 2), "action_mask", "test")
    vector.reset(seed=0)
    illegal = np.zeros(2, np.int64)  # action 0 is often illegal: such a step ends the episode with an empty mask
    ended_on_an_empty_mask = 0
    for _ in range(30):
        _, _, terminated, _, _ = vector.step(illegal)
        ended_on_an_empty_mask += int(terminated.sum())  # MaskedChoice terminates only on an illegal action
    assert ended_on_an_empty_mask > 0
    assert vector.steps.max() <= 5
    vector.close()


def test_an_env_with_its_mask_in_info_is_never_vectorized():
    factory = EnvFactory({"_target_": f"{__name__}.vectorized_faulty_choice", "action_mask_key": "info"})
    assert factory.vector_env(2) is None


@pytest.mark.slow
def test_masked_choice_is_learned_with_masks_and_never_an_illegal_action_while_without_them_it_is_not(tmp_path):
    # IMPALA's one step per batch: within this budget it learns the task with the mask and not without; APPO's many
    # steps learn to avoid most illegal actions even without the mask, which would blur the comparison
    common = ["+env=masked_choice", "algorithm=impala", "runner=sequential", "max_env_steps=60000", "target_return=null", "seed=1"]
    masked = run_train(*common, run_dir=tmp_path / "masked")
    assert masked.returncode == 0, masked.stderr
    rows = read_stats(tmp_path / "masked")
    assert all(row["env/illegal"] == 0 and row["eval/env/illegal"] == 0 for row in rows)
    assert rows[-1]["eval/return_mean"] > 14  # the best play scores about 16; random legal play about 10
    unmasked = run_train(*common, "env.action_mask_key=false", run_dir=tmp_path / "unmasked")
    assert unmasked.returncode == 0, unmasked.stderr
    last = read_stats(tmp_path / "unmasked")[-1]
    assert last["env/illegal"] > 0.5 and last["eval/return_mean"] < rows[-1]["eval/return_mean"] - 2
    out = rollout(f"checkpoint={tmp_path / 'masked' / 'checkpoints' / 'last.pt'}", "episodes=3")
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("algorithm", [["algorithm=ppo"], ["algorithm=appo"], ["algorithm=dqn"],
                                       ["algorithm=sac", "algorithm.initial_buffer_size=200", "algorithm.batch_size=32"]])
def test_every_discrete_algorithm_trains_within_the_mask(tmp_path, algorithm):
    result = run_train("+env=masked_choice", "runner=sequential", "max_env_steps=3000", "target_return=null",
                       "epoch_length=2", *algorithm, run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr
    rows = read_stats(tmp_path / "run")
    assert all(row["env/illegal"] == 0 for row in rows if "env/illegal" in row)
    assert rows[-1]["eval/env/illegal"] == 0 and np.isfinite(rows[-1]["eval/return_mean"])


class InfoMaskChoice(MaskedChoice):
    """MaskedChoice that gives its mask as info["action_mask"] beside a plain Box observation."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.observation_space = self.observation_space["obs"]

    def reset(self, *, seed=None, options=None):
        observation, info = super().reset(seed=seed, options=options)
        return observation["obs"], {**info, "action_mask": observation["action_mask"]}

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation["obs"], reward, terminated, truncated, {**info, "action_mask": observation["action_mask"]}


def test_a_mask_in_info_is_found_and_moved_into_the_observations():
    from maze_cli.envs.factory import EnvFactory

    factory = EnvFactory({"_target_": "tests.test_action_masks.InfoMaskChoice"}).resolved()
    assert factory.config["action_mask_key"] == "info"
    observation_space, action_space = factory.check()
    assert set(observation_space.spaces) == {"obs", "action_mask"}
    assert factory.action_mask_key(observation_space, action_space) == "action_mask"
    env = factory()
    observation, _ = env.reset(seed=3)
    assert observation["action_mask"].dtype == np.int8 and (observation["action_mask"] == observation["obs"]).all()
    assert EnvFactory({"id": "CartPole-v1"}).resolved().config.get("action_mask_key") is None


@pytest.mark.slow
def test_a_multiagent_envs_masks_reach_every_agents_rows(tmp_path):
    pytest.importorskip("pettingzoo")
    from tests.test_multiagent import team_config

    result = run_train(*team_config(tmp_path, masked="true"), "runner=sequential", "max_env_steps=2000",
                       "epoch_length=2", run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr
    rows = read_stats(tmp_path / "run")
    # only the action that earns is legal: every agent earns all 8 steps' reward in every episode (the team's
    # return sums both agents'); unmasked, random play earns half of it
    assert all(row["train/return_mean"] == 8 and row["env/team_return"] == 16 for row in rows)
    assert rows[-1]["eval/env/team_return"] == 16
