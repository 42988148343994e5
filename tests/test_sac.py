"""SAC through the real `train` command, and its learner on every supported action kind."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from maze_cli.algorithms.sac import Sac, SacObjective, SacPolicy
from maze_cli.learner import Learner
from maze_cli.policies import mlp_network
from maze_cli.parallel.workers_with_buffer import SampledBatch
from maze_cli.records import Transitions
from tests.cli import run_train
from tests.helpers import processes_with_env_tag
from tests.test_cli_errors import assert_one_line_error
from tests.test_train import read_stats

FAST = ["algorithm.initial_buffer_size=256", "algorithm.batch_size=64", "policy.hidden_sizes=[32,32]"]


@pytest.mark.slow
def test_pendulum_improves_far_above_random(tmp_path):
    run_dir = tmp_path / "run"
    # reproducible: one run, the same every time, so the budget is what it needs (asynchronous runs spread)
    result = run_train("+env=pendulum", "algorithm=sac", "runner=subproc", "runner.reproducible=true", "max_env_steps=10000",
                       "target_return=null", run_dir=run_dir, timeout=400)
    assert result.returncode == 0, result.stderr
    stats = read_stats(run_dir)
    returns = [row["train/return_mean"] for row in stats if "train/return_mean" in row]
    assert returns[0] < -900  # a random policy scores about -1200
    assert max(returns[-2:]) > -500, returns
    last = stats[-1]
    for key in ("learner/critic_loss", "learner/policy_loss", "learner/alpha", "learner/q_mean", "buffer/size",
                "buffer/fill", "learner/replay_ratio", "time/sample_s", "queue_size"):
        assert key in last, key
    assert last["learner/replay_ratio"] == pytest.approx(1.0, abs=0.05)
    assert processes_with_env_tag(result.tag) == []


def test_an_epoch_lasts_the_algorithms_iterations_unless_epoch_length_is_set(tmp_path):
    """SAC's iteration is 16 gradient steps, so its own epoch is 16 of them (a row and a target check
    about every second); `epoch_length=` still sets it."""
    steps_per_iteration = 8 * Sac.envs_per_actor  # n_rollout_steps x envs_per_actor, one rollout per iteration
    for name, extra, length in (("default", [], Sac.epoch_length), ("set", ["epoch_length=2"], 2)):
        result = run_train("+env=pendulum", "algorithm=sac", "runner=sequential", "runner.n_actors=1", "max_env_steps=2000",
                           "eval.interval=0", *FAST, *extra, run_dir=tmp_path / name)
        assert result.returncode == 0, result.stderr
        steps = [row["env_steps"] for row in read_stats(tmp_path / name)]
        assert {b - a for a, b in zip(steps, steps[1:-1])} == {length * steps_per_iteration}, steps
    assert (Sac.epoch_length, Sac.envs_per_actor) == (16, 2)


@pytest.mark.parametrize("extra", [
    ["+env=cartpole"],  # discrete SAC
    ["+env=pendulum", "replay_buffer=prioritized"],
    ["+env=pendulum", "algorithm.split_rollouts_into_transitions=false", "algorithm.batch_size=8"],
])
def test_sac_variants_run_end_to_end(tmp_path, extra):
    result = run_train("algorithm=sac", "runner=sequential", "max_env_steps=1200", "epoch_length=4", *FAST, *extra,
                       run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr
    last = read_stats(tmp_path / "run")[-1]
    assert last["learner/updates"] > 0 and np.isfinite(last["learner/critic_loss"])


def test_a_checkpoint_can_be_the_initial_sampling_policy(tmp_path):
    first = run_train("+env=pendulum", "algorithm=sac", "runner=sequential", "max_env_steps=600", *FAST, run_dir=tmp_path / "a")
    assert first.returncode == 0, first.stderr
    checkpoint = tmp_path / "a" / "checkpoints" / "last.pt"
    second = run_train("+env=pendulum", "algorithm=sac", "runner=subproc", "max_env_steps=600", *FAST,
                       f"algorithm.initial_sampling_policy={checkpoint}", run_dir=tmp_path / "b")
    assert second.returncode == 0, second.stderr
    log = (tmp_path / "b" / "train.log").read_text()
    assert f"first 256 transitions: SacPolicy ({checkpoint})" in log, log  # the checkpoint's policy, not random actions
    assert "uniform random actions" in (tmp_path / "a" / "train.log").read_text()


def test_bad_sac_input_gets_one_line(tmp_path):
    assert_one_line_error(run_train("+env=pendulum", "algorithm=sac", "algorithm.initial_sampling_policy=/no/such.pt",
                                    run_dir=tmp_path / "a"), "algorithm.initial_sampling_policy", "no such checkpoint")
    assert_one_line_error(run_train("+env=pendulum", "algorithm=sac", "algorithm.tau=2", run_dir=tmp_path / "b"),
                          "algorithm.tau=2", "<= 1")
    assert_one_line_error(run_train("+env=pendulum", "algorithm=sac", "replay_buffer=ring", run_dir=tmp_path / "c"),
                          "replay_buffer=ring", "prioritized", "uniform")


def random_transitions(obs_space: gym.Space, action_space: gym.Space, n: int = 64) -> SampledBatch:
    obs = torch.randn(n, *obs_space.shape)
    actions = torch.stack([torch.as_tensor(action_space.sample()) for _ in range(n)]).float()
    if isinstance(action_space, gym.spaces.Discrete):
        actions = actions.long()
    t = Transitions({"obs": obs}, actions, torch.randn(n), {"obs": torch.randn(n, *obs_space.shape)}, torch.rand(n) < 0.1)
    return SampledBatch(t, np.arange(n), torch.ones(n), 1)


@pytest.mark.parametrize("action_space", [gym.spaces.Box(-2.0, 2.0, (2,)), gym.spaces.Discrete(3)])
def test_the_critic_fits_a_fixed_target(action_space):
    obs_space = gym.spaces.Box(-1.0, 1.0, (4,))
    torch.manual_seed(0)
    network = mlp_network((32, 32), "relu")
    policy = SacPolicy(obs_space, action_space, network)
    learner = Learner(SacObjective(policy, Sac(gamma=0.0, lr=3e-3), network))
    batch = random_transitions(obs_space, action_space)
    losses = [learner.update(batch)["critic_loss"] for _ in range(300)]
    # gamma = 0: the target is the reward itself, which the critics can fit.
    assert losses[-1] < 0.2 * losses[0]
    actions, logp, _ = policy.act({"obs": batch.transitions.observations["obs"]})
    if isinstance(action_space, gym.spaces.Box):
        assert (actions.abs() <= 2.0).all()
    assert torch.isfinite(logp).all()


def test_the_squashed_gaussian_log_prob_matches_torch_distributions():
    """log pi(a) of a = bias + scale * tanh(u), u ~ N(mean, std), against torch's own transformed distribution."""
    from torch.distributions import AffineTransform, Independent, Normal, TanhTransform, TransformedDistribution

    space = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
    policy = SacPolicy(gym.spaces.Box(-1.0, 1.0, (3,)), space, mlp_network((8,), "relu"))
    torch.manual_seed(0)
    mean, log_std = torch.randn(1000, 2) * 0.5, torch.rand(1000, 2) * 2 - 1.5
    actions, logp = policy.squashed_sample(torch.cat([mean, log_std], dim=-1))
    reference = TransformedDistribution(Independent(Normal(mean, log_std.exp()), 1),
                                        [TanhTransform(), AffineTransform(policy.bias, policy.scale)])
    assert ((actions >= torch.tensor([-2.0, 0.0])) & (actions <= torch.tensor([2.0, 1.0]))).all()
    torch.testing.assert_close(logp, reference.log_prob(actions), atol=2e-3, rtol=1e-4)
    # A wrong Jacobian (forgetting the scale) would be off by sum(log scale) = log 2 + log 0.5 = 0 here,
    # so check the scale term on its own with a one-sided box as well.
    one_sided = SacPolicy(gym.spaces.Box(-1.0, 1.0, (3,)), gym.spaces.Box(0.0, 4.0, (1,)), mlp_network((8,), "relu"))
    a, lp = one_sided.squashed_sample(torch.tensor([[0.3, -0.5]]))
    ref = TransformedDistribution(Independent(Normal(torch.tensor([[0.3]]), torch.tensor([[-0.5]]).exp()), 1),
                                  [TanhTransform(), AffineTransform(one_sided.bias, one_sided.scale)])
    torch.testing.assert_close(lp, ref.log_prob(a), atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("action_space", [gym.spaces.Box(-1.0, 1.0, (2,)), gym.spaces.Discrete(3)])
def test_with_policy_cnn_the_critic_loss_alone_trains_the_shared_conv_encoder(action_space):
    from maze_cli.policies.cnn import CnnNetwork

    obs_space = gym.spaces.Box(0, 255, (12, 12, 3), np.uint8)
    network = {"_target_": f"{CnnNetwork.__module__}.CnnNetwork", "hidden_sizes": [16]}
    torch.manual_seed(0)
    learner = Learner(SacObjective(SacPolicy(obs_space, action_space, network), Sac(), network))
    encoder = learner.policy.network.encoder.images
    assert all(net.encoder.images is encoder for net in learner.objective.critic.nets)
    assert not {id(p) for p in encoder.parameters()} & {id(p) for p in learner.groups["policy"].params}
    batch = random_transitions(gym.spaces.Box(0.0, 1.0, obs_space.shape), action_space)
    before = [p.detach().clone() for p in encoder.parameters()]
    learner.update(batch)
    assert all(not torch.equal(a, b) for a, b in zip(before, encoder.parameters()))  # the critic step moved it
    # With the critic's step switched off, the actor's step moves its head and leaves the encoder be.
    learner.groups["critic"].lr = 0.0  # the lr each update's schedule sets
    before = [p.detach().clone() for p in encoder.parameters()]
    head_before = learner.policy.head.weight.detach().clone()
    learner.update(batch)
    assert not torch.equal(head_before, learner.policy.head.weight)
    assert all(torch.equal(a, b) for a, b in zip(before, encoder.parameters()))
    # Without sharing, each network keeps its own encoder.
    separate = SacObjective(SacPolicy(obs_space, action_space, network), Sac(share_encoder=False), network)
    assert separate.critic.nets[0].encoder.images is not separate.policy.network.encoder.images


def _perturbed(module: torch.nn.Module) -> None:
    """Move a target network away from its online twin, so that a loss that reads the wrong one shows."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.3)


@pytest.mark.parametrize("discrete", [False, True])
def test_sacs_losses_equal_the_papers_formulas_computed_by_hand(discrete):
    """One update's three losses against Haarnoja et al. (2018, eqs. 5, 7 and 18; the discrete form of
    Christodoulou 2019), written here from the networks' outputs and torch.distributions alone:
        y = r + gamma (1 - d) (min_i Q'_i(s', a') - alpha log pi(a'|s')),  a' ~ pi(.|s')
        L_Q = E[w (Q_1(s, a) - y)^2] + E[w (Q_2(s, a) - y)^2]
        L_pi = E[alpha log pi(a|s) - min_i Q_i(s, a)],  a ~ pi(.|s)
        L_alpha = -E[log alpha (log pi(a|s) + target entropy)]
    (discrete: the expectations over actions taken exactly with pi's probabilities)."""
    from torch.distributions import AffineTransform, Independent, Normal, TanhTransform, TransformedDistribution

    from maze_cli.algorithms.sac import _LOG_STD_MAX, _LOG_STD_MIN
    from maze_cli.contract import UpdateContext
    from tests.learner_cases import CARTPOLE, PENDULUM, transitions

    spaces = CARTPOLE if discrete else PENDULUM
    torch.manual_seed(5)
    network = mlp_network((16, 16), "relu")
    policy = SacPolicy(*spaces, network)
    hp = Sac(gamma=0.9, init_alpha=0.3)
    objective = SacObjective(policy, hp, network)
    _perturbed(objective.critic_target)
    batch = transitions(spaces)
    tr, w = batch.transitions, batch.weights
    torch.manual_seed(1)
    critic_step, actor_step = objective.steps(batch, UpdateContext(torch.device("cpu"), 0, 0, 1.0, {}))

    alpha, log_alpha = torch.tensor(0.3), torch.log(torch.tensor(0.3))
    torch.manual_seed(1)

    def pi(observations):
        """The policy's distribution at `observations`: (actions or probabilities, log-probs)."""
        out = policy.head(policy.network(observations, (), None)[0])
        if discrete:
            log_p = torch.log_softmax(out, -1)
            return log_p.exp(), log_p
        mean, log_std = out.chunk(2, -1)
        squash = [TanhTransform(cache_size=1), AffineTransform(policy.bias, policy.scale, cache_size=1)]
        dist = TransformedDistribution(Independent(Normal(mean, log_std.clamp(_LOG_STD_MIN, _LOG_STD_MAX).exp()), 1), squash)
        a = dist.rsample()
        return a, dist.log_prob(a)

    with torch.no_grad():
        a_next, logp_next = pi(tr.next_observations)
        if discrete:
            q_next = torch.min(*objective.critic_target(tr.next_observations))
            v_next = (a_next * (q_next - alpha * logp_next)).sum(-1)
        else:
            v_next = torch.min(*objective.critic_target(tr.next_observations, a_next)) - alpha * logp_next
        y = tr.rewards + 0.9 * (~tr.terminated).float() * v_next
    if discrete:
        q1, q2 = (q.gather(-1, tr.actions.unsqueeze(-1)).squeeze(-1) for q in objective.critic(tr.observations))
    else:
        q1, q2 = objective.critic(tr.observations, tr.actions)
    critic_loss = (w * (q1 - y) ** 2).mean() + (w * (q2 - y) ** 2).mean()

    a, logp = pi(tr.observations)
    if discrete:
        q_min = torch.min(*objective.critic(tr.observations))
        policy_loss = (a * (alpha * logp - q_min)).sum(-1).mean()
        entropy = -(a * logp).sum(-1)
        alpha_loss = -(log_alpha * (hp.target_entropy_scale * math.log(2) - entropy)).mean()
    else:
        policy_loss = (alpha * logp - torch.min(*objective.critic(tr.observations, a))).mean()
        alpha_loss = -(log_alpha * (logp + (-1.0))).mean()  # the target entropy: -dim(A)

    close = {"rtol": 1e-4, "atol": 2e-3}  # torch's exact tanh Jacobian against the policy's log(1 - tanh^2 + 1e-6)
    torch.testing.assert_close(critic_step.losses["critic"], critic_loss, **close)
    torch.testing.assert_close(actor_step.losses["policy"], policy_loss, **close)
    torch.testing.assert_close(actor_step.losses["alpha"], alpha_loss, **close)
