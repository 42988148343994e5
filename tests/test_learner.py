"""The shared learner (maze_cli/learner.py): every algorithm's update through it is the update a plain
PyTorch loop makes of the same objective's steps, and its options behave as documented."""

from __future__ import annotations

import pytest
import torch

from tests import learner_cases
from tests.learner_cases import CASES


def _plain_updates(objective, batch, n: int, max_env_steps: int | None) -> None:
    """`n` updates as a plain PyTorch loop makes them, from the objective's steps alone: each loss
    backpropagated into its group's parameters, the group's gradient clipped by torch's own
    `clip_grad_norm_` (each part on its own where it has parts), a `torch.optim.Adam` step; the lr of
    an annealed group scaled by the budget left; `after_update` once per update, `summary` once per batch."""
    from maze_cli.contract import UpdateContext

    groups = objective.optimizer_groups()
    adams = {name: torch.optim.Adam(g.params, lr=g.lr, eps=g.eps) for name, g in groups.items()}
    updates, env_steps = 0, 0
    for _ in range(n):
        left = 1.0 - env_steps / max_env_steps if max_env_steps else 1.0
        for name, g in groups.items():
            adams[name].param_groups[0]["lr"] = g.lr * left if g.anneal else g.lr
        lrs = {name: adam.param_groups[0]["lr"] for name, adam in adams.items()}

        def context() -> UpdateContext:
            return UpdateContext(torch.device("cpu"), updates, env_steps, left, lrs)

        steps = []
        for step in objective.steps(batch, context()):
            for name in step.losses:
                adams[name].zero_grad()
            for i, (name, loss) in enumerate(step.losses.items()):
                torch.autograd.backward(loss, inputs=groups[name].params, retain_graph=i < len(step.losses) - 1)
            norms = {}
            for name in step.losses:
                g = groups[name]
                if g.max_grad_norm is not None:
                    norms[name] = torch.nn.utils.get_total_norm([p.grad for p in g.params if p.grad is not None])
                    for part in g.clip_parts or [g.params]:
                        torch.nn.utils.clip_grad_norm_(part, g.max_grad_norm)
                adams[name].step()
            steps.append(dict(step.metrics) | {"grad_norm" if len(norms) == 1 else f"grad_norm/{k}": v for k, v in norms.items()})
            if step.ends_update:
                updates += 1
                objective.after_update(context())
        objective.summary(batch, steps, context())  # (where running statistics take in the batch)
        env_steps += objective.env_steps(batch)


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_update_of_the_shared_learner_is_a_plain_pytorch_loop_over_its_objectives_steps(case):
    """The learner's machinery (its fused Adam, clipping, lr schedule, counters, the order of steps
    and of `after_update`) against a plain PyTorch loop written here (`_plain_updates`) on a twin of
    the same case: every parameter after two updates. What the losses are is checked against the
    papers' formulas in each algorithm's tests (test_vtrace, test_ppo, test_sac, test_td3, test_dqn)."""
    learner, batch, modules = CASES[case]()
    twin, twin_batch, twin_modules = CASES[case]()
    torch.manual_seed(5)  # PPO's minibatch permutations, SAC's samples
    for _ in range(2):
        learner.update(batch)
    torch.manual_seed(5)
    _plain_updates(twin.objective, twin_batch, 2, twin.max_env_steps)
    for prefix, module in modules.items():
        for name, p in module.named_parameters():
            torch.testing.assert_close(p, twin_modules[prefix].get_parameter(name), rtol=1e-5, atol=1e-6, msg=f"{prefix}.{name}")
    if hasattr(learner.objective, "log_alpha"):
        torch.testing.assert_close(learner.objective.log_alpha, twin.objective.log_alpha)


def test_a_bf16_update_stays_close_to_the_fp32_one_and_keeps_the_loss_math_in_fp32():
    """Under bf16 autocast the network runs in bf16 while losses and targets stay fp32: the losses of
    the same batch agree with fp32's to bf16's precision, and every parameter keeps its fp32 dtype."""
    from tests.learner_cases import CASES

    results = {}
    for precision in ("fp32", "bf16"):
        learner, batch, _ = CASES["impala_cartpole"](precision=precision)
        metrics = learner.update(batch)
        assert metrics["loss"].dtype == torch.float32
        assert all(p.dtype == torch.float32 for p in learner.policy.parameters())
        results[precision] = {k: float(v) for k, v in metrics.items()}
    for key in ("loss", "policy_loss", "value_loss", "entropy"):
        assert results["bf16"][key] == pytest.approx(results["fp32"][key], rel=0.05, abs=0.02), key


def test_auto_precision_is_fp32_for_mlps_and_for_conv_policies_only_where_the_cpu_computes_bf16_faster(monkeypatch):
    from maze_cli import precision

    for faster in (True, False):
        monkeypatch.setattr(precision, "cpu_computes_bf16_faster", lambda: faster)
        assert precision.auto_precision(torch.device("cpu"), convolutional=False) == "fp32"
        assert precision.auto_precision(torch.device("cpu"), convolutional=True) == ("bf16" if faster else "fp32")


@pytest.mark.parametrize("vendor,flags,pays", [
    ("GenuineIntel", "avx2 avx512f avx512_bf16 amx_bf16 amx_tile", True),   # AMX: bf16 matrix units
    ("AuthenticAMD", "avx2 avx512f avx512_bf16", True),                     # Zen 4: bf16 dot products at full width
    ("GenuineIntel", "avx2 avx512f avx512_bf16", False),                    # measured slower in bf16 without AMX
    ("AuthenticAMD", "avx2 fma", False),                                    # no bf16 instructions: only emulated
])
def test_bf16_pays_on_cpus_with_amx_or_amds_avx512_bf16(vendor, flags, pays):
    from maze_cli.precision import bf16_pays_on_cpu

    cpuinfo = f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: fpu sse2 {flags}\n"
    assert bf16_pays_on_cpu(cpuinfo) is pays


def test_auto_precision_on_a_gpu_is_bf16_only_for_large_conv_policies(monkeypatch):
    """On a GPU a small net's update waits on kernel launches and autocast adds casts: MinAtar's conv
    policy (132k parameters) ran slower in bf16, the nature CNN (883k) faster."""
    from maze_cli.precision import GPU_BF16_MIN_PARAMETERS, auto_precision

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    cuda = torch.device("cuda")
    assert auto_precision(cuda, convolutional=True, parameters=883_000) == "bf16"
    assert auto_precision(cuda, convolutional=True, parameters=132_000) == "fp32"
    assert auto_precision(cuda, convolutional=False, parameters=10 * GPU_BF16_MIN_PARAMETERS) == "fp32"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert auto_precision(cuda, convolutional=True, parameters=883_000) == "fp32"


def test_under_cuda_graphs_a_compiled_loss_returns_tensors_the_next_call_cannot_overwrite():
    """compile_mode=reduce-overhead on a GPU replays every call into the same output memory; the
    learner keeps an update's metrics until the epoch's end, so each call must hand back copies (a
    real run on a GPU failed with "accessing tensor output of CUDAGraphs that has been overwritten"
    before). Checked here where it can be: the copies are new tensors, and the loss among them
    still backpropagates."""
    from maze_cli.precision import CompiledFunction

    weight = torch.nn.Parameter(torch.ones(3))
    held = {}

    def loss_fn(x):
        loss = (weight * x).sum()
        held["loss"] = loss
        return loss, {"loss": loss.detach(), "parts": [x.mean()]}

    loss, metrics = CompiledFunction(loss_fn, "test", "reduce-overhead", cuda_graphs=True)(torch.arange(3.0))
    loss.backward()
    torch.testing.assert_close(weight.grad, torch.arange(3.0))
    assert metrics["loss"].item() == 3.0 and metrics["parts"][0].item() == 1.0
    for out in (loss, metrics["loss"], metrics["parts"][0]):
        assert out.untyped_storage().data_ptr() != held["loss"].untyped_storage().data_ptr()


def test_metrics_recorded_as_tensors_are_read_back_once_in_the_order_recorded():
    from maze_cli.stats.aggregator import EpochStatsAggregator

    stats = EpochStatsAggregator()
    stats.add("learner/loss", torch.tensor(1.0))
    stats.add("learner/loss", 3.0)
    stats.add("learner/loss", torch.tensor(2.0, dtype=torch.bfloat16))
    stats.add("time/learner_s", 0.5)
    assert stats.values("learner/loss") == [1.0, 3.0, 2.0] or sorted(stats.values("learner/loss")) == [1.0, 2.0, 3.0]
    assert stats.get("learner/loss") == pytest.approx(2.0)
    assert set(stats.events()) == {"learner/loss", "time/learner_s"}
    stats.clear()
    assert stats.get("learner/loss") is None


def test_a_non_finite_loss_is_caught_before_the_weights_are_published():
    from maze_cli.learner import Learner
    from maze_cli.errors import NonFiniteLoss

    learner = Learner()
    learner.watch({"critic_loss": torch.tensor(1.0), "policy_loss": torch.tensor(float("nan"))})
    with pytest.raises(NonFiniteLoss, match="learner/policy_loss became nan"):
        learner.check_finite()
    learner.watch({"critic_loss": torch.tensor(1.0)})
    learner.check_finite()  # the next iteration starts afresh


def test_gradients_of_one_loss_never_reach_another_groups_parameters():
    """SAC's actor loss flows through the critics; its step must leave the critics' gradients alone."""
    from maze_cli.learner import Learner

    a, b = torch.nn.Parameter(torch.tensor(2.0)), torch.nn.Parameter(torch.tensor(3.0))
    learner = Learner()
    learner.add_optimizer("a", [a], lr=0.1)
    learner.add_optimizer("b", [b], lr=0.1, max_grad_norm=0.5)
    norms = learner.step({"a": a * b, "b": b * b})
    assert float(a.grad) == 3.0 and float(b.grad) == pytest.approx(6.0 * 0.5 / 6.0)  # b's own gradient, clipped
    assert float(norms["b"]) == pytest.approx(6.0) and "a" not in norms


def test_clip_parts_clip_each_parts_gradient_norm_on_its_own():
    """A large gradient of one part (a value network fitting returns in the hundreds) no longer shrinks
    another part's (the policy's) gradient; clipped together, it does. `grad_norm` is the joint norm."""
    from maze_cli.learner import Learner

    grads = {}
    for parts in (None, "apart"):
        a, b = torch.nn.Parameter(torch.tensor(0.0)), torch.nn.Parameter(torch.tensor(0.0))
        learner = Learner()
        learner.add_optimizer("g", [a, b], lr=0.1, max_grad_norm=0.5, clip_parts=None if parts is None else [[a], [b]])
        norms = learner.step({"g": 30.0 * a + 0.4 * b})
        assert float(norms["g"]) == pytest.approx((30.0 ** 2 + 0.4 ** 2) ** 0.5)
        grads[parts] = float(a.grad), float(b.grad)
    assert grads["apart"] == pytest.approx((0.5, 0.4))  # b under the clip keeps its gradient
    scale = 0.5 / (30.0 ** 2 + 0.4 ** 2) ** 0.5
    assert grads[None] == pytest.approx((30.0 * scale, 0.4 * scale))


@pytest.mark.parametrize("algorithm, shared, option, split", [
    ("impala", False, None, False), ("impala", False, True, True), ("impala", True, True, False),
    ("ppo", False, None, False), ("ppo", False, True, True)])
def test_the_policy_and_value_networks_are_clipped_apart_when_asked(algorithm, shared, option, split):
    """`algorithm.clip_per_network=true` (IMPALA, PPO, APPO; off by default), with a value network of its own
    (a shared network has one norm). The parts cover every parameter once, the value side alone in the second."""
    from maze_cli.algorithms.impala import Impala, ImpalaObjective
    from maze_cli.algorithms.ppo import Ppo, PpoObjective
    from maze_cli.policies import ActorCritic

    from tests.learner_cases import CARTPOLE

    policy = ActorCritic(*CARTPOLE, shared_network=shared)
    hp = {} if option is None else {"clip_per_network": option}
    objective = ImpalaObjective(policy, Impala(**hp)) if algorithm == "impala" else PpoObjective(policy, Ppo(**hp))
    parts = objective.optimizer_groups()["policy"].clip_parts
    if not split:
        assert parts is None or len(parts) == 1
        return
    actor, value = parts
    assert {id(p) for p in value} == {id(p) for p in [*policy.value_network.parameters(), *policy.value_head.parameters()]}
    assert sorted(map(id, actor + value)) == sorted(map(id, policy.parameters()))


@pytest.mark.slow
def test_a_compiled_loss_equals_the_eager_one_and_compiles_once_for_every_batch():
    """learner.compile=true: the compiled IMPALA and PPO (annealed clip) updates give the eager update's
    numbers, and later batches of the same shape (new data, a new clip) compile nothing again."""
    from torch._dynamo.utils import counters

    from tests.learner_cases import CASES

    for case in ("impala_cartpole", "ppo_pendulum_annealed"):
        eager, batch, _ = CASES[case]()
        compiled, _, _ = CASES[case](compile=True)
        for learner in (eager, compiled):
            torch.manual_seed(5)
            metrics = learner.update(batch)
        torch.testing.assert_close(float(metrics["loss"]), float(eager.metrics.values("learner/loss")[0]), rtol=1e-4, atol=1e-5)
        for p_eager, p_compiled in zip(eager.policy.parameters(), compiled.policy.parameters()):
            torch.testing.assert_close(p_compiled, p_eager, rtol=1e-4, atol=1e-5)
        graphs = counters["stats"]["unique_graphs"]
        for i in range(3):
            fresh = batch.map(lambda t: t.clone())
            fresh.rewards.normal_()
            compiled.update(fresh)
        assert counters["stats"]["unique_graphs"] == graphs, f"{case}: a later batch compiled again"


@pytest.mark.parametrize("normalize", [True, False])
def test_normalized_advantages_make_impalas_policy_gradient_the_same_on_any_reward_scale(normalize):
    """With `normalize_advantage` the entropy bonus weighs the same against the policy gradient
    whatever the rewards' scale (a sparse 0/1 reward, a cost in the hundreds): the same batch with
    rewards times 10 gives the policy network the same gradient. Without it, it does not."""
    from tests.learner_cases import CARTPOLE, _actor_critic_case

    grads = []
    for scale in (1.0, 10.0):
        # no clipping: the value loss grows with the rewards and would change the global norm's clip factor
        learner, batch, _ = _actor_critic_case("impala", CARTPOLE, normalize_advantage=normalize, max_grad_norm=1e9)
        with torch.no_grad():  # V = 0 everywhere: the advantages are the V-trace returns, linear in the rewards
            learner.policy.value_head.weight.zero_()
            learner.policy.value_head.bias.zero_()
        batch.rewards.mul_(scale)
        learner.update(batch)
        grads.append({n: p.grad.clone() for n, p in learner.policy.named_parameters() if n.startswith(("network.", "policy_head."))})
    same = all(torch.allclose(grads[0][n], grads[1][n], rtol=1e-4, atol=1e-6) for n in grads[0])
    assert same == normalize


@pytest.mark.parametrize("algorithm", ["impala", "ppo"])
def test_anneal_lr_lowers_the_lr_linearly_over_the_budget_and_is_saved_in_checkpoints(algorithm):
    """`algorithm.anneal_lr=true`: each update's lr is `lr x (1 - env steps consumed / max_env_steps)`,
    0 once the budget is spent; a learner restored from its state goes on where it was."""
    from maze_cli.algorithms.impala import Impala, ImpalaObjective
    from maze_cli.algorithms.ppo import Ppo, PpoObjective
    from maze_cli.learner import Learner
    from maze_cli.policies import ActorCritic, mlp_network

    batch = learner_cases.rollout(learner_cases.CARTPOLE)
    steps = batch.rewards.numel()

    def make(anneal: bool):
        policy = ActorCritic(*learner_cases.CARTPOLE, mlp_network((8,)))
        if algorithm == "impala":
            return Learner(ImpalaObjective(policy, Impala(lr=1e-3, anneal_lr=anneal)), max_env_steps=4 * steps)
        return Learner(PpoObjective(policy, Ppo(lr=1e-3, anneal_lr=anneal, n_minibatches=2)), max_env_steps=4 * steps)

    annealed, constant = make(True), make(False)
    lrs = []
    for _ in range(5):
        for learner in (annealed, constant):
            learner.update(batch)
        lrs.append(annealed.groups["policy"].optimizer.param_groups[0]["lr"])
        assert constant.groups["policy"].optimizer.param_groups[0]["lr"] == 1e-3
    assert lrs == pytest.approx([1e-3, 0.75e-3, 0.5e-3, 0.25e-3, 0.0])  # the lr of each update, before it consumed its batch
    restored = make(True)
    restored.load_state_dict(annealed.state_dict())
    restored.update(batch)
    assert restored.env_steps == 6 * steps and restored.groups["policy"].optimizer.param_groups[0]["lr"] == 0.0


def test_anneal_lr_follows_a_time_budget_that_ends_first_and_a_resume_goes_on_from_its_seconds(monkeypatch):
    """With `max_time_s` set, the lr falls with the seconds of training where they run out before the
    env steps (a run on a time budget alone would otherwise keep its lr); a restored learner counts on
    from the seconds its checkpoint holds, not from 0."""
    import maze_cli.learner as learner_module
    from maze_cli.algorithms.ppo import Ppo, PpoObjective
    from maze_cli.learner import Learner
    from maze_cli.policies import ActorCritic, mlp_network

    clock = [100.0]
    monkeypatch.setattr(learner_module.time, "perf_counter", lambda: clock[0])
    batch = learner_cases.rollout(learner_cases.CARTPOLE)

    def make(max_time_s):
        policy = ActorCritic(*learner_cases.CARTPOLE, mlp_network((8,)))
        return Learner(PpoObjective(policy, Ppo(lr=1e-3, anneal_lr=True, n_minibatches=2)), max_env_steps=10**9,
                       max_time_s=max_time_s)

    def lr(learner):
        return learner.groups["policy"].optimizer.param_groups[0]["lr"]

    learner = make(max_time_s=40.0)
    lrs = []
    for _ in range(3):
        learner.update(batch)  # the clock starts at the first update
        lrs.append(lr(learner))
        clock[0] += 10.0
    assert lrs == pytest.approx([1e-3, 0.75e-3, 0.5e-3])
    restored = make(max_time_s=40.0)
    restored.load_state_dict(learner.state_dict())  # 30 s of training behind it
    clock[0] += 500.0  # startup of the resumed session is not charged
    restored.update(batch)
    assert lr(restored) == pytest.approx(0.25e-3)
    clock[0] += 20.0
    restored.update(batch)
    assert lr(restored) == 0.0
    untimed = make(max_time_s=None)
    untimed.update(batch)
    clock[0] += 1e6
    untimed.update(batch)
    assert lr(untimed) == pytest.approx(1e-3, rel=1e-6)  # only the env-step budget, hardly begun
