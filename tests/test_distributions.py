"""Hand-written action distributions against torch.distributions: log_prob, entropy, mode and sampling.

Sampling checks use a fixed seed, so they are deterministic; their tolerances are still chosen as if
they were not (chi-square at p = 0.001, means and stds within 5 standard errors), so a reseed never
turns them red, while a wrong std or a biased Gumbel trick is off by far more than that.
"""

import contextlib
import math

import gymnasium as gym
import pytest
import torch
from torch.distributions import Categorical as TorchCategorical
from torch.distributions import Independent, Normal

from maze_cli.policies.distributions import Categorical, DiagGaussian, MultiCategorical, make_distribution

BATCH_SHAPES = [(), (5,), (3, 4)]  # (3, 4) is a time-major [T, B] batch
CHI2_CRIT_P001 = {3: 16.27, 9: 27.88, 18: 42.31, 23: 49.73}  # chi-square critical values at p = 0.001
NVEC = [3, 2, 4]


@contextlib.contextmanager
def seeded(seed):
    """The distributions sample from torch's global generator: seed it without leaking into other tests."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def generator(seed):
    return torch.Generator().manual_seed(seed)


def chi_square(counts, probs):
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


# ---------------------------------------------------------------------------------------- Categorical


@pytest.mark.parametrize("batch", BATCH_SHAPES)
@pytest.mark.parametrize("scale", [1.0, 30.0])  # 30: nearly deterministic choices, log-probs far below zero
def test_categorical_log_prob_and_entropy_match_torch(batch, scale):
    g = generator(1)
    logits = scale * torch.randn(*batch, 6, generator=g)
    actions = torch.randint(0, 6, batch, generator=g)
    ours, ref = Categorical(6), TorchCategorical(logits=logits)
    assert ours.n_params == 6
    torch.testing.assert_close(ours.log_prob(logits, actions), ref.log_prob(actions), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.entropy(logits), ref.entropy(), atol=1e-5, rtol=1e-5)
    assert ours.log_prob(logits, actions).shape == batch and ours.entropy(logits).shape == batch


def test_categorical_log_prob_accepts_float_actions():
    """Actions travel as float tensors in some buffers; log_prob casts them."""
    logits = torch.randn(4, 5, generator=generator(2))
    actions = torch.tensor([0, 4, 2, 1])
    torch.testing.assert_close(Categorical(5).log_prob(logits, actions.float()), Categorical(5).log_prob(logits, actions))


@pytest.mark.parametrize("batch", BATCH_SHAPES)
def test_categorical_mode_is_the_most_likely_action(batch):
    logits = torch.randn(*batch, 6, generator=generator(3))
    mode = Categorical(6).mode(logits)
    assert mode.shape == batch and mode.dtype == torch.int64
    assert torch.equal(mode, TorchCategorical(logits=logits).mode)


def test_categorical_sampling_frequencies_match_softmax():
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0])
    n = 100_000
    with seeded(0):
        samples = Categorical(4).sample(logits.expand(n, 4))
    assert samples.shape == (n,) and samples.dtype == torch.int64
    counts = torch.bincount(samples, minlength=4).double()
    probs = torch.softmax(logits.double(), -1)
    assert chi_square(counts, probs) < CHI2_CRIT_P001[3]


def test_categorical_sampling_is_per_row_in_a_time_major_batch():
    """Each [t, b] row samples from its own logits (argmax over the last dim only)."""
    logits = torch.randn(2, 3, 4, generator=generator(4))  # [T, B, n]
    n = 20_000
    with seeded(1):
        samples = Categorical(4).sample(logits.expand(n, 2, 3, 4))
    assert samples.shape == (n, 2, 3)
    probs = torch.softmax(logits.double(), -1)
    stat = 0.0
    for t in range(2):
        for b in range(3):
            stat += chi_square(torch.bincount(samples[:, t, b], minlength=4).double(), probs[t, b])
    assert stat < CHI2_CRIT_P001[18]  # 6 independent rows of 3 degrees of freedom each


def test_categorical_sampling_of_a_certain_choice():
    logits = torch.tensor([[0.0, 60.0, 0.0], [-60.0, -60.0, 0.0]])
    with seeded(2):
        samples = Categorical(3).sample(logits.repeat(1000, 1))
    assert samples.view(1000, 2).eq(torch.tensor([1, 2])).all()


# ----------------------------------------------------------------------------------- MultiCategorical


def torch_multi_categorical(logits):
    return [TorchCategorical(logits=part) for part in logits.split(NVEC, dim=-1)]


@pytest.mark.parametrize("batch", BATCH_SHAPES)
def test_multi_categorical_log_prob_and_entropy_match_torch(batch):
    g = generator(5)
    logits = 2 * torch.randn(*batch, sum(NVEC), generator=g)
    actions = torch.stack([torch.randint(0, n, batch, generator=g) for n in NVEC], dim=-1)
    ours, parts = MultiCategorical(NVEC), torch_multi_categorical(logits)
    assert ours.n_params == sum(NVEC)
    ref_log_prob = sum(d.log_prob(actions[..., i]) for i, d in enumerate(parts))
    ref_entropy = sum(d.entropy() for d in parts)
    torch.testing.assert_close(ours.log_prob(logits, actions), ref_log_prob, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.entropy(logits), ref_entropy, atol=1e-5, rtol=1e-5)
    assert ours.log_prob(logits, actions).shape == batch and ours.entropy(logits).shape == batch


@pytest.mark.parametrize("batch", BATCH_SHAPES)
def test_multi_categorical_mode_is_each_parts_most_likely_action(batch):
    logits = torch.randn(*batch, sum(NVEC), generator=generator(6))
    mode = MultiCategorical(NVEC).mode(logits)
    assert mode.shape == (*batch, len(NVEC))
    assert torch.equal(mode, torch.stack([d.mode for d in torch_multi_categorical(logits)], dim=-1))


def test_multi_categorical_sampling_matches_the_product_of_its_parts():
    """Joint frequencies over all 24 combinations: catches wrong marginals and dependent parts alike."""
    logits = torch.tensor([0.5, -0.3, 0.0, 1.0, -1.0, 0.2, 0.0, -0.5, 0.8])
    n = 100_000
    with seeded(3):
        samples = MultiCategorical(NVEC).sample(logits.expand(n, -1))
    assert samples.shape == (n, 3) and samples.dtype == torch.int64
    for i, size in enumerate(NVEC):
        assert 0 <= samples[:, i].min() and samples[:, i].max() < size
    cell = (samples[:, 0] * NVEC[1] + samples[:, 1]) * NVEC[2] + samples[:, 2]
    counts = torch.bincount(cell, minlength=24).double()
    p0, p1, p2 = (torch.softmax(part.double(), -1) for part in logits.split(NVEC))
    probs = (p0[:, None, None] * p1[None, :, None] * p2[None, None, :]).flatten()
    assert chi_square(counts, probs) < CHI2_CRIT_P001[23]


# --------------------------------------------------------------------------------------- DiagGaussian


def torch_gaussian(params, dim):
    mean, log_std = params.split(dim, dim=-1)
    return Independent(Normal(mean, log_std.clamp(-20.0, 2.0).exp()), 1)


@pytest.mark.parametrize("batch", BATCH_SHAPES)
def test_diag_gaussian_log_prob_and_entropy_match_torch(batch):
    g = generator(7)
    mean = 3 * torch.randn(*batch, 3, generator=g, dtype=torch.float64)
    log_std = torch.empty(*batch, 3, dtype=torch.float64).uniform_(-5.0, 1.5, generator=g)
    params = torch.cat([mean, log_std], dim=-1)
    actions = mean + 2 * torch.randn(*batch, 3, generator=g, dtype=torch.float64)
    ours, ref = DiagGaussian(3), torch_gaussian(params, 3)
    assert ours.n_params == 6
    torch.testing.assert_close(ours.log_prob(params, actions), ref.log_prob(actions))
    torch.testing.assert_close(ours.entropy(params), ref.entropy())
    assert ours.log_prob(params, actions).shape == batch and ours.entropy(params).shape == batch


def test_diag_gaussian_float32_matches_torch():
    g = generator(8)
    params = torch.cat([torch.randn(4, 2, generator=g), torch.empty(4, 2).uniform_(-3.0, 1.0, generator=g)], dim=-1)
    actions = torch.randn(4, 2, generator=g)
    ref = torch_gaussian(params, 2)
    torch.testing.assert_close(DiagGaussian(2).log_prob(params, actions), ref.log_prob(actions))
    torch.testing.assert_close(DiagGaussian(2).entropy(params), ref.entropy())


# (given log std, the one that applies): below, at and just inside each end of [-20, 2]
CLAMP_CASES = [(-25.0, -20.0), (-20.0, -20.0), (-19.5, -19.5), (1.99, 1.99), (2.0, 2.0), (7.0, 2.0)]


def test_diag_gaussian_clamps_log_std_to_its_range():
    given = torch.tensor([c[0] for c in CLAMP_CASES], dtype=torch.float64)
    applied = torch.tensor([c[1] for c in CLAMP_CASES], dtype=torch.float64)
    dim = len(CLAMP_CASES)
    mean = torch.linspace(-1.0, 1.0, dim, dtype=torch.float64)
    params = torch.cat([mean, given]).expand(5, -1)
    z = torch.randn(5, dim, generator=generator(9), dtype=torch.float64)
    actions = mean + applied.exp() * z  # within a few stds of the mean even where the std is e^-20
    ref = Independent(Normal(mean, applied.exp()), 1)
    ours = DiagGaussian(dim)
    torch.testing.assert_close(ours.log_prob(params, actions), ref.log_prob(actions))
    torch.testing.assert_close(ours.entropy(params), ref.entropy().expand(5))
    expected_entropy = float((applied + 0.5 * (1 + math.log(2 * math.pi))).sum())
    assert ours.entropy(params)[0].item() == pytest.approx(expected_entropy, rel=1e-12)


def test_diag_gaussian_mode_is_the_mean():
    g = generator(10)
    mean = torch.randn(3, 4, 2, generator=g)
    for log_std in (torch.full((3, 4, 2), -30.0), torch.randn(3, 4, 2, generator=g), torch.full((3, 4, 2), 9.0)):
        assert torch.equal(DiagGaussian(2).mode(torch.cat([mean, log_std], dim=-1)), mean)


def test_diag_gaussian_sampling_mean_std_and_independence():
    mean = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
    log_std = torch.tensor([-1.0, 0.0, 1.0, 5.0], dtype=torch.float64)  # 5.0 is clamped to 2.0
    std = log_std.clamp(-20.0, 2.0).exp()
    params = torch.cat([mean, log_std])
    n = 200_000
    with seeded(4):
        samples = DiagGaussian(4).sample(params.expand(n, -1))
    assert samples.shape == (n, 4) and samples.dtype == torch.float64
    # Standard errors: of a mean std/sqrt(n), of a std about std/sqrt(2n) (normal samples).
    assert ((samples.mean(0) - mean).abs() < 5 * std / math.sqrt(n)).all()
    assert ((samples.std(0) / std - 1).abs() < 5 / math.sqrt(2 * n)).all()
    # Dimensions are independent: off-diagonal correlations within 5 standard errors (1/sqrt(n)) of 0.
    corr = torch.corrcoef(samples.T)
    assert (corr - torch.eye(4, dtype=torch.float64)).abs().max() < 5 / math.sqrt(n)
    # Samples and log_prob agree: E[-log p(x)] is the entropy (per dim the variance of z^2 / 2 is 1/2).
    neg_log_prob = -DiagGaussian(4).log_prob(params.expand(n, -1), samples)
    assert abs(neg_log_prob.mean() - DiagGaussian(4).entropy(params)) < 5 * math.sqrt(4 * 0.5 / n)


def test_diag_gaussian_sampling_is_per_element_in_a_time_major_batch():
    g = generator(11)
    mean = torch.randn(2, 3, 2, generator=g, dtype=torch.float64)  # [T, B, dim]
    log_std = torch.empty(2, 3, 2, dtype=torch.float64).uniform_(-2.0, 1.0, generator=g)
    n = 50_000
    with seeded(5):
        samples = DiagGaussian(2).sample(torch.cat([mean, log_std], dim=-1).expand(n, -1, -1, -1))
    assert samples.shape == (n, 2, 3, 2)
    std = log_std.exp()
    assert ((samples.mean(0) - mean).abs() < 5 * std / math.sqrt(n)).all()
    assert ((samples.std(0) / std - 1).abs() < 5 / math.sqrt(2 * n)).all()


# ----------------------------------------------------------------------------------- make_distribution


def test_make_distribution_sizes_its_parameters_from_the_space():
    discrete = make_distribution(gym.spaces.Discrete(4))
    assert isinstance(discrete, Categorical) and discrete.n_params == 4
    multi = make_distribution(gym.spaces.MultiDiscrete(NVEC))
    assert isinstance(multi, MultiCategorical) and multi.n_params == 9 and multi.sizes == NVEC
    box = make_distribution(gym.spaces.Box(-1.0, 1.0, shape=(2, 3)))
    assert isinstance(box, DiagGaussian) and box.dim == 6 and box.n_params == 12


# ------------------------------------------------------------------ acting: a sample and its log-prob at once


def test_categorical_sample_with_log_prob_returns_the_log_softmax_of_the_chosen_action():
    logits = torch.randn(7, 5, generator=generator(10)) * 3
    with seeded(4):
        actions, logp = Categorical(5).sample_with_log_prob(logits)
    assert actions.shape == logp.shape == (7,) and actions.dtype == torch.int64
    assert torch.equal(logp, Categorical(5).log_prob(logits, actions))
    assert torch.equal(logp, torch.log_softmax(logits, -1)[torch.arange(7), actions])


def test_multi_categorical_and_gaussian_sample_with_log_prob_match_log_prob():
    logits = torch.randn(6, sum(NVEC), generator=generator(11))
    with seeded(5):
        actions, logp = MultiCategorical(NVEC).sample_with_log_prob(logits)
    assert actions.shape == (6, 3) and torch.equal(logp, MultiCategorical(NVEC).log_prob(logits, actions))
    params = torch.cat([torch.randn(6, 2, generator=generator(12)), torch.empty(6, 2).uniform_(-3.0, 1.0, generator=generator(13))], -1)
    with seeded(6):
        actions, logp = DiagGaussian(2).sample_with_log_prob(params)
    assert actions.shape == (6, 2)
    torch.testing.assert_close(logp, DiagGaussian(2).log_prob(params, actions), atol=1e-5, rtol=1e-6)


def test_a_policy_acts_with_its_probabilities_and_reports_their_log():
    """`Policy.act` on a batch of copies of three observations: per observation, the action counts
    against the policy's softmax (chi-square at p = 0.001, 3 x 3 degrees of freedom), and every
    log-prob equals the distribution's log_prob of the action taken. The same counts against a
    slightly different policy (logits halved) are far beyond the bound: the check can fail."""
    from maze_cli.policies import ActorCritic, mlp_network

    space = gym.spaces.Box(-1.0, 1.0, (2,), float)
    torch.manual_seed(0)
    policy = ActorCritic(space, gym.spaces.Discrete(4), mlp_network((8,)))
    with torch.no_grad():
        policy.policy_head.weight.mul_(100.0)  # away from the near-uniform start (gain 0.01), so a wrong sampler shows
    obs = torch.tensor([[0.5, -0.5], [-1.0, 0.2], [0.9, 0.9]])
    n = 20_000
    batch = {"obs": obs.repeat(n, 1)}
    with seeded(7):
        actions, logp, _ = policy.act(batch)
    with torch.no_grad():
        params, _ = policy.action_params(batch, (), None)
    assert torch.equal(logp, policy.distribution.log_prob(params, actions))
    per_obs = actions.view(n, 3)
    logits = params[:3].double()
    probs = torch.softmax(logits, -1)
    assert probs.max() < 0.99 and probs.min() > 0.002  # no action certain or unseen
    counts = [torch.bincount(per_obs[:, i], minlength=4).double() for i in range(3)]
    assert sum(chi_square(c, p) for c, p in zip(counts, probs)) < CHI2_CRIT_P001[9]
    wrong = torch.softmax(logits / 2, -1)
    assert sum(chi_square(c, p) for c, p in zip(counts, wrong)) > 10 * CHI2_CRIT_P001[9]
