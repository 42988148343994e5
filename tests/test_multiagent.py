"""Multi-agent (PettingZoo) envs: each agent a row of the actors' batch, one shared policy."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import torch

pytest.importorskip("pettingzoo")

from maze_cli.algorithms.impala import Impala, ImpalaObjective  # noqa: E402
from maze_cli.algorithms.ppo import Ppo, PpoObjective  # noqa: E402
from maze_cli.learner import Learner  # noqa: E402
from maze_cli.envs import EnvFactory  # noqa: E402
from maze_cli.envs.batch import make_env_batch  # noqa: E402
from maze_cli.envs.multiagent import MultiAgentBatch  # noqa: E402
from maze_cli.parallel import SequentialDistributedActors  # noqa: E402
from maze_cli.policies import ActorCritic, mlp_network  # noqa: E402
from maze_cli.records import Rollout  # noqa: E402
from tests.cli import REPO, run_train  # noqa: E402
from tests.helpers import processes_with_env_tag, wait_until  # noqa: E402
from tests.test_learners import assert_each_learner_made, learners_in_processes  # noqa: E402

TEAM = {"_target_": "tests.envs.signal_team_env", "length": 6}
LEAVING = {**TEAM, "leave_at": 2}  # agent_1 is done after 2 of the 6 steps


def env_config(tmp_path: Path, **env) -> list[str]:
    """Overrides that train on the env of `env` (a config file of the user's own)."""
    config_dir = tmp_path / "configs"
    (config_dir / "env").mkdir(parents=True, exist_ok=True)
    lines = "".join(f"  {k}: {v}\n" for k, v in env.items())
    (config_dir / "env" / "mine.yaml").write_text(f"# @package _global_\nenv:\n{lines}target_return: null\n")
    return ["--config-dir", str(config_dir), "+env=mine"]


def team_config(tmp_path: Path, **options) -> list[str]:
    """Overrides that train on `tests.envs.signal_team_env`, 8 steps an episode."""
    return env_config(tmp_path, _target_="tests.envs.signal_team_env", length=8, **options)


def read_stats(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]


def collect(config: dict, n_steps: int = 24, envs: int = 4):
    factory = EnvFactory(config)
    observation_space, action_space = factory.check()
    policy = ActorCritic(observation_space, action_space, mlp_network((8,)))
    with SequentialDistributedActors(factory, policy, n_steps, 1, 1, envs_per_actor=envs) as actors:
        return actors.collect_outputs("cpu")[0], actors, policy


def test_each_agent_is_a_row_of_the_batch():
    batch = make_env_batch(EnvFactory(TEAM), 5)
    assert isinstance(batch, MultiAgentBatch)
    assert len(batch.envs) == 2 and batch.agents == ("agent_0", "agent_1")  # the fifth row pads: always masked
    batch.reset(0)
    step = batch.step(torch.zeros(5, dtype=torch.int64).numpy())
    assert step.autoreset.tolist() == [False, False, False, False, True]
    batch.close()


def test_a_finished_agents_steps_are_autoreset_steps_and_never_reach_the_learner():
    batch, actors, _ = collect(LEAVING)
    obs = batch.observations["obs"][:-1]  # the observation each step acted on
    finished = obs[..., 1] == 5.0  # the value signal_team_env gives only an agent that is done
    assert finished[:, 1::2].any() and not finished[:, 0::2].any()
    assert torch.equal(batch.autoreset, finished)  # exactly the finished agent's steps are masked
    # agent_1 terminates with its 2nd step of each 6: steps 1, 7, 13, 19 of its rows
    assert batch.terminated[:, 1].nonzero().flatten().tolist() == [1, 7, 13, 19]
    assert batch.terminated[:, 0].nonzero().flatten().tolist() == [5, 11, 17, 23]
    assert (batch.rewards[batch.autoreset] == 0).all()
    # Episode stats: agent_1's episodes are 2 steps long, agent_0's 6; the team return sums both.
    assert sorted({int(x) for x in actors.get_epoch_stats_aggregator().values("episode_length")}) == [2, 6]


@pytest.mark.parametrize("learner", ["impala", "ppo"])
def test_the_learners_loss_ignores_every_step_of_a_finished_agent(learner):
    """Whatever a finished agent's rows hold, the loss is the same: they are masked out (a learner that
    trained on them would see the garbage)."""
    batch, _, policy = collect(LEAVING)

    def loss_with(garbage: float) -> float:
        torch.manual_seed(0)
        fresh = ActorCritic(policy.observation_space, policy.action_space, mlp_network((8,)))
        if learner == "impala":
            trainer = Learner(ImpalaObjective(fresh, Impala(lr=0.0)))
        else:
            trainer = Learner(PpoObjective(fresh, Ppo(lr=0.0, n_epochs=1, n_minibatches=1, normalize_advantage=False)))
        altered = batch.map(lambda t: t.clone())
        dead = batch.observations["obs"][:-1, :, 1] == 5.0  # the finished agent's steps, told by what it observes
        altered.actions[dead] = int(garbage) % 2
        altered.rewards[dead] = garbage
        altered.behaviour_logp[dead] = -abs(garbage) / 10  # (a ratio that overflows would be nan even times 0)
        return float(trainer.update(altered)["loss"])

    assert loss_with(7.0) == pytest.approx(loss_with(-30.0), abs=1e-5)


@pytest.mark.parametrize("algorithm,runner", [("impala", "sequential"), ("impala", "subproc"), ("ppo", "sequential"),
                                              ("ppo", "subproc"), ("appo", "subproc")])
def test_a_shared_policy_learns_the_cooperative_env(tmp_path, algorithm, runner):
    """Each agent must repeat a bit only it sees: random play earns half the team's best (8 per agent)."""
    run_dir = tmp_path / "run"
    result = run_train(*team_config(tmp_path), f"algorithm={algorithm}", f"runner={runner}", "max_env_steps=40000", "epoch_length=10",
                       "eval.episodes=4", "seed=1", run_dir=run_dir, timeout=240)
    assert result.returncode == 0, result.stderr
    rows = read_stats(run_dir)
    last = rows[-1]
    assert last["eval/return_mean"] >= 7.5  # per agent; random play: 4
    assert last["eval/env/team_return"] == pytest.approx(2 * last["eval/return_mean"])
    assert {"env/team_return", "env/agent/agent_0/return", "env/agent/agent_1/return"} <= set(last)
    assert rows[0]["env/agent/agent_0/return"] < last["env/agent/agent_0/return"]


def test_ray_actors_step_a_multiagent_env(tmp_path):
    pytest.importorskip("ray")
    run_dir = tmp_path / "run"
    result = run_train(*team_config(tmp_path), "runner=ray", "max_env_steps=20000", "eval.episodes=2", run_dir=run_dir,
                       env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    assert result.returncode == 0, result.stderr
    assert {"env/team_return", "env/agent/agent_1/return"} <= set(read_stats(run_dir)[-1])


def test_rollout_plays_all_agents(tmp_path):
    run_dir = tmp_path / "run"
    trained = run_train(*team_config(tmp_path), "runner=sequential", "max_env_steps=30000", "eval.episodes=2", run_dir=run_dir)
    assert trained.returncode == 0, trained.stderr
    assert "   return     team ret(win)" in trained.stdout + trained.stderr  # the console's team return column
    rollout = Path(run_train.__globals__["TRAIN"]).with_name("rollout")
    proc = subprocess.run([str(rollout), f"checkpoint={run_dir / 'checkpoints' / 'best.pt'}", "episodes=3",
                           "allow=[tests.envs.signal_team_env]"], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("3 episodes: return 8.00") and "episode length 8.0" in proc.stdout


def test_agents_with_differing_spaces_are_one_line(tmp_path):
    result = run_train(*team_config(tmp_path, differing_spaces="true"), "runner=sequential", run_dir=tmp_path / "run")
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0
    assert "agent agent_1's observation space Box(0.0, 5.0, (3,), float32) differs from agent agent_0's" in result.stderr


def test_fewer_envs_per_actor_than_agents_is_one_line(tmp_path):
    result = run_train(*team_config(tmp_path, n_agents=3), "runner=sequential", "runner.envs_per_actor=2",
                       run_dir=tmp_path / "run")
    assert result.returncode != 0, result.stdout
    assert "runner.envs_per_actor=3" in result.stderr


def test_a_pettingzoo_aec_env_runs_an_epoch(tmp_path):
    """MPE's simple_spread (3 agents, its AEC form: converted with aec_to_parallel) from the mpe2 package,
    with an evaluation video."""
    pytest.importorskip("mpe2")
    run_dir = tmp_path / "run"
    result = run_train(*env_config(tmp_path, _target_="mpe2.simple_spread_v3.env", max_cycles=25), "algorithm=ppo",
                       "runner=sequential", "max_env_steps=5000", "eval.episodes=2", "eval.video=true", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    last = read_stats(run_dir)[-1]
    assert {f"env/agent/agent_{i}/return" for i in range(3)} <= set(last)
    assert last["train/episode_length_mean"] == 25
    videos = list((run_dir / "videos").iterdir())  # evaluation's video: all agents in MPE's own rendering
    assert len(videos) == 1 and videos[0].stat().st_size > 1000


def test_sac_with_a_multiagent_env_is_one_line(tmp_path):
    result = run_train(*team_config(tmp_path), "algorithm=sac", "runner=sequential", run_dir=tmp_path / "run")
    assert result.returncode != 0
    assert result.stderr.strip() == ("train: error: algorithm=sac: a multi-agent (PettingZoo) env trains with algorithm=impala, "
                                     "appo or ppo; SAC's replay buffer takes single-agent envs only")


def test_the_agent_id_key_lets_a_shared_policy_act_per_agent(tmp_path):
    """agent_1 must answer the opposite of its bit: without its index a shared policy cannot serve both
    agents (4 of 8 per agent in expectation), with it the team reaches the maximum."""
    factory = EnvFactory({**TEAM, "agent_id": True})
    observation_space, _ = factory.check()
    assert set(observation_space.spaces) == {"obs", "agent_id"}
    returns = {}
    for agent_id, steps in (("false", 40000), ("true", 150000)):
        run_dir = tmp_path / f"run_{agent_id}"
        result = run_train(*team_config(tmp_path, opposite="true", agent_id=agent_id), "algorithm=impala", "runner=sequential",
                           f"max_env_steps={steps}", "eval.episodes=8", "seed=1", run_dir=run_dir, timeout=240)
        assert result.returncode == 0, result.stderr
        returns[agent_id] = read_stats(run_dir)[-1]["eval/return_mean"]
    assert returns["false"] <= 6.0 and returns["true"] >= 7.5, returns


def test_agent_id_on_a_single_agent_env_is_one_line(tmp_path):
    result = run_train("+env=cartpole", "+env.agent_id=true", run_dir=tmp_path / "run")
    assert result.returncode != 0
    assert "env.agent_id" in result.stderr and result.stderr.strip().count("\n") == 0


# -- several learners (learner.num_learners) ----------------------------------------------------------
def _rows(batch: Rollout, rows: list[int]) -> Rollout:
    """The rows `rows` of a time-major batch (batch-first fields indexed on their first dim)."""
    def take(name: str, value):
        dim = 0 if name in Rollout.BATCH_FIRST else 1
        pick = (lambda t: t[rows]) if dim == 0 else (lambda t: t[:, rows])
        if isinstance(value, dict):
            return {k: pick(v) for k, v in value.items()}
        if isinstance(value, tuple):
            return tuple(pick(v) for v in value)
        return None if value is None else pick(value)

    return Rollout(**{f.name: take(f.name, getattr(batch, f.name)) for f in dataclasses.fields(batch)})


def _team_learner(algorithm: str, spaces, group=None):
    """A seeded learner: the same initial weights in every process."""
    torch.manual_seed(7)
    policy = ActorCritic(*spaces, mlp_network((16, 16), "tanh"))
    if algorithm == "impala":
        return Learner(ImpalaObjective(policy, Impala(normalize_advantage=False)), "cpu", group=group)
    # one minibatch, advantages as they are: the batch-wide statistics are then those of every learner's batch
    hp = Ppo(n_epochs=2, n_minibatches=1, normalize_advantage=False, entropy_coef=0.01)
    return Learner(PpoObjective(policy, hp, False), "cpu", max_env_steps=10_000, group=group)


def _team_learner_process(rank: int, port: int, algorithm: str, spaces, batch: Rollout, rows: list[int], updates: int, results) -> None:
    from maze_cli.distributed import GroupSpec, LearnerGroup

    torch.set_num_threads(1)
    group = LearnerGroup(GroupSpec(rank, 2, "127.0.0.1", port, 60.0))
    try:
        learner = _team_learner(algorithm, spaces, group)
        for _ in range(updates):
            learner.update(_rows(batch, rows))
        results.put((rank, {k: v.detach().numpy() for k, v in learner.policy.state_dict().items()}))
    finally:
        group.close()


@pytest.mark.parametrize("algorithm", ["impala", "ppo"])
def test_two_learners_on_unevenly_masked_rows_make_the_update_of_one_learner_on_all_rows(algorithm):
    """Learner 0 takes the rows of agent_0 (every step a transition), learner 1 those of agent_1 (done
    after 2 of 6 steps: two thirds of its steps masked). Their gradients are averaged weighted by their
    real steps, so the two make the update of one learner on all rows; an average of the two learners'
    means would weigh agent_1's few steps as much as agent_0's many."""
    batch, _, policy = collect(LEAVING, envs=8)
    spaces = (policy.observation_space, policy.action_space)
    agent_0, agent_1 = list(range(0, 8, 2)), list(range(1, 8, 2))
    real = (~batch.autoreset).sum(0)
    assert int(real[agent_0].sum()) == 3 * int(real[agent_1].sum())  # the shares differ: the weighting matters
    updates = 4
    got = learners_in_processes(_team_learner_process, {0: (algorithm, spaces, batch, agent_0, updates),
                                                        1: (algorithm, spaces, batch, agent_1, updates)})
    torch.set_num_threads(1)
    alone = _team_learner(algorithm, spaces)
    for _ in range(updates):
        alone.update(batch)
    assert_each_learner_made(got, alone.policy.state_dict(), _team_learner(algorithm, spaces).policy.state_dict())


@pytest.mark.parametrize("algorithm", ["impala", "ppo"])
def test_two_learners_learn_the_cooperative_env_each_row_counting_both(tmp_path, algorithm):
    """learner.num_learners=2 on a PettingZoo env: each learner steps its own actor's envs of 2 agents;
    the rows count both learners' agent steps and episodes, and the team learns."""
    run_dir = tmp_path / "run"
    result = run_train(*team_config(tmp_path), f"algorithm={algorithm}", "runner=subproc", "learner.num_learners=2",
                       "runner.envs_per_actor=16", "runner.batch_size=1", "algorithm.n_rollout_steps=32", "epoch_length=10",
                       "max_env_steps=40000", "eval.episodes=4", "seed=1", run_dir=run_dir, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "learner 1 (pid" in result.stdout + result.stderr
    rows = read_stats(run_dir)
    # an epoch of 10 iterations, each learner learning from its own rollout of 16 rows (8 envs x 2 agents) x 32 steps
    assert rows[0]["env_steps"] == 2 * 10 * 16 * 32
    # every episode is 8 steps: the epoch's episodes are those of both learners' rows (and of the rollouts
    # PPO dropped as collected by an older policy, whose steps it does not count)
    assert rows[0]["train/episodes"] * 8 == rows[0]["env_steps"] + rows[0]["dropped_rollouts"] * 16 * 32
    assert rows[-1]["eval/return_mean"] >= 7.5  # per agent; random play: 4
    assert rows[-1]["eval/env/team_return"] == pytest.approx(2 * rows[-1]["eval/return_mean"])
    assert wait_until(lambda: processes_with_env_tag(result.tag) == [], timeout=15)


def test_a_multiagent_run_resumes_and_warm_starts_from_its_checkpoints(tmp_path):
    """As for a single-agent run: `resume=` goes on from last.pt to a larger budget, and `init_from=`
    starts a new run with the trained shared policy (its first evaluation at the best, where a fresh
    policy plays at random, 4 per agent)."""
    trained_dir = tmp_path / "trained"
    common = [*team_config(tmp_path), "runner=sequential", "eval.episodes=4", "seed=1"]
    trained = run_train(*common, "max_env_steps=40000", "epoch_length=10", run_dir=trained_dir)
    assert trained.returncode == 0, trained.stderr
    assert read_stats(trained_dir)[-1]["eval/return_mean"] >= 7.5
    last = trained_dir / "checkpoints" / "last.pt"

    resumed = run_train(f"resume={trained_dir}", "max_env_steps=50000")
    assert resumed.returncode == 0, resumed.stderr
    rows = read_stats(trained_dir)
    assert rows[-1]["env_steps"] >= 50000 and "env/team_return" in rows[-1]

    warm_dir = tmp_path / "warm"
    warm = run_train(*common, f"init_from={last}", "algorithm.lr=1e-9", "max_env_steps=1000", "epoch_length=1", run_dir=warm_dir)
    assert warm.returncode == 0, warm.stderr
    assert read_stats(warm_dir)[0]["eval/return_mean"] >= 7.5


@pytest.mark.slow
def test_ppo_learns_mpes_simple_spread(tmp_path):
    """An env of PettingZoo's ecosystem (mpe2, extra multiagent) learned: uniform random play returns about
    -26.5 per agent (benchmarks/multiagent_random.py); the shared policy gets clearly above it."""
    pytest.importorskip("mpe2")
    run_dir = tmp_path / "run"
    result = run_train("+env=simple_spread", "algorithm=ppo", "runner=subproc", "max_env_steps=230400", "eval.episodes=20",
                       "seed=1", run_dir=run_dir, timeout=600)
    assert result.returncode == 0, result.stderr
    best = max(row["eval/return_mean"] for row in read_stats(run_dir) if "eval/return_mean" in row)
    assert best >= -23.5, best  # random play: -26.5 +- 0.9 for a mean of 20 episodes x 3 agents


@pytest.mark.parametrize("algorithm,override,scaled", [("impala", None, False), ("ppo", None, False),
                                                       ("impala", "algorithm.normalize_reward=true", True)])
def test_the_rewards_of_several_agents_with_box_actions_are_scaled_only_when_asked(tmp_path, algorithm, override, scaled):
    """`normalize_reward: null` scales rewards for Box actions, but not where several agents act: on MPE
    scaled returns made the shared policy collapse (benchmarks/SUITE.md). The observations of Box actions
    are still normalized."""
    pytest.importorskip("mpe2")
    run_dir = tmp_path / "run"
    result = run_train("+env=simple_spread", "env.continuous_actions=true", f"algorithm={algorithm}", "runner=sequential",
                       "max_env_steps=3000", "epoch_length=1", "eval.interval=0", *([override] if override else []), run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    checkpoint = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ("reward_scaler" in checkpoint["learner"]["algorithm"]) is scaled
    assert any(key.startswith("obs_normalizer.") for key in checkpoint["learner"]["policy"])
