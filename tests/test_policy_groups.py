"""Policy groups (`env.policy_groups`): agents of different kinds, one policy each, in one run."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import gymnasium as gym
import pytest
import torch

pytest.importorskip("pettingzoo")

from maze_cli.checkpoint import load_policy  # noqa: E402
from maze_cli.envs import EnvFactory  # noqa: E402
from maze_cli.envs.policy_groups import GROUP_KEY, shared_action_space  # noqa: E402
from maze_cli.errors import EnvConfigError  # noqa: E402
from maze_cli.parallel import SequentialDistributedActors  # noqa: E402
from maze_cli.policies import ActorCritic, mlp_network  # noqa: E402
from maze_cli.policies.groups import PolicyGroups, grouped_policy  # noqa: E402
from tests.cli import REPO, TRAIN, run_train  # noqa: E402
from tests.test_multiagent import read_stats, team_config  # noqa: E402

# agent_1 is of another kind (Box(3,) observations, three actions) and must answer the opposite of its bit
KINDS = {"_target_": "tests.envs.signal_team_env", "length": 8, "differing_spaces": True, "opposite": True}
GROUPS_CLI = "+env.policy_groups={first: [agent_0], second: [agent_1]}"


def grouped(network: dict | None = None, **env) -> tuple[EnvFactory, PolicyGroups]:
    factory = EnvFactory({**KINDS, "policy_groups": {"first": ["agent_0"], "second": ["agent_1"]}, **env})
    observation_space, action_space = factory.check()
    parts = SimpleNamespace(env_factory=factory, observation_space=observation_space, action_space=action_space)
    torch.manual_seed(3)
    policy, _ = grouped_policy(ActorCritic, parts, {"network": network or mlp_network((8,))})
    return factory, policy


def test_each_group_has_its_own_spaces_and_the_rows_one_layout():
    factory, policy = grouped()
    observation_space, action_space = factory.check()
    assert set(observation_space.spaces) == {GROUP_KEY, "first", "second"}
    assert observation_space["first"].shape == (2,) and observation_space["second"].shape == (3,)
    assert action_space == gym.spaces.Discrete(3)  # the larger of Discrete(2) and Discrete(3)
    assert {name: member.action_space for name, member in policy.members.items()} == {
        "first": gym.spaces.Discrete(2), "second": gym.spaces.Discrete(3)}
    assert policy.members["first"].network is not policy.members["second"].network


def test_every_groups_value_network_is_clipped_apart_from_the_policy_networks():
    """IMPALA's `clip_per_network` over policy groups: the members' action sides in one part, their value
    sides in the other, every parameter once."""
    _, policy = grouped()
    actor, value = policy.network_parameters()
    values = [p for m in policy.members.values() for p in [*m.value_network.parameters(), *m.value_head.parameters()]]
    assert {id(p) for p in value} == {id(p) for p in values}
    assert sorted(map(id, actor + value)) == sorted(map(id, policy.parameters()))


@pytest.mark.parametrize("core", ["identity", "lstm"])
def test_each_groups_rows_go_to_its_own_policy(core):
    """The grouped policy's outputs on a collected batch are, row by row, those of the row's group's own
    policy on its rows alone; the smaller group never samples an action beyond its space (the env
    raises on one)."""
    network = {**mlp_network((8,)), "core": core, "core_size": 8}
    factory, policy = grouped(network)
    with SequentialDistributedActors(factory, policy, 6, 1, 1, envs_per_actor=4) as actors:
        batch = actors.collect_outputs("cpu")[0]
    out = policy(batch.observations, batch.initial_state, batch.episode_start)
    group = batch.observations[GROUP_KEY][0]
    states = policy._states(batch.initial_state)
    for index, (name, member) in enumerate(policy.members.items()):
        cols = (group == index).nonzero().squeeze(1)
        mine = {m: batch.observations[k][:, cols] for k, m in policy.keys[name].items()}
        own = member(mine, tuple(s[cols] for s in states[index]), batch.episode_start[:, cols])
        n = member.action_space.n
        torch.testing.assert_close(out.params[:, cols, :n], own.params)
        torch.testing.assert_close(out.values[:, cols], own.values)
        assert bool((out.params[:, cols, n:] <= -1e8).all())
    assert int(batch.actions[:, group == 0].max()) <= 1


def test_a_checkpoints_blueprint_rebuilds_every_group(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train(*team_config(tmp_path, differing_spaces="true", opposite="true"), GROUPS_CLI, "runner=sequential",
                       "max_env_steps=2000", "eval.episodes=2", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    policy = load_policy(run_dir / "checkpoints" / "last.pt", trusted=(), trust=False, where="test")
    assert isinstance(policy, PolicyGroups) and list(policy.members) == ["first", "second"]
    state = policy.state_dict()
    assert any(k.startswith("members.first.") for k in state) and any(k.startswith("members.second.") for k in state)


@pytest.mark.parametrize("algorithm,runner", [("impala", "subproc"), ("ppo", "sequential")])
def test_two_kinds_of_agents_learn_each_with_its_own_policy(tmp_path, algorithm, runner):
    """The agents differ in spaces and in what earns: each group's policy learns its own answer (random
    play earns about 4 of 8 per agent), each group's return is a stat, and `rollout` plays both."""
    run_dir = tmp_path / "run"
    result = run_train(*team_config(tmp_path, differing_spaces="true", opposite="true"), GROUPS_CLI, f"algorithm={algorithm}",
                       f"runner={runner}", "max_env_steps=60000", "epoch_length=10", "eval.episodes=4", "seed=1",
                       run_dir=run_dir, timeout=240)
    assert result.returncode == 0, result.stderr
    rows = read_stats(run_dir)
    last = rows[-1]
    assert last["eval/return_mean"] >= 7.5, last["eval/return_mean"]
    assert last["eval/env/group/first/return"] >= 7.5 and last["eval/env/group/second/return"] >= 7.5
    assert rows[0]["env/group/second/return"] < last["env/group/second/return"]
    rollout = TRAIN.with_name("rollout")
    proc = subprocess.run([str(rollout), f"checkpoint={run_dir / 'checkpoints' / 'best.pt'}", "episodes=3",
                           "allow=[tests.envs.signal_team_env]"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("3 episodes: return 8.00"), proc.stdout


@pytest.mark.parametrize("groups,message", [
    ("{first: [agent_0], second: [agent_9]}", "env.policy_groups.second: ['agent_9'] names no agent of the env; its agents are agent_0, agent_1"),
    ("{first: [agent_0], second: ['agent_*']}", "env.policy_groups: agent agent_0 is claimed by two groups, first and second"),
    ("{first: [agent_0]}", "env.policy_groups: agent agent_1 in no group; add it to one"),
    ("{first: [agent_0, agent_1]}", "env.policy_groups.first: agent agent_1's observation space Box(3,) float32 differs from agent agent_0's"),
])
def test_bad_policy_groups_are_one_line_before_any_actor_starts(tmp_path, groups, message):
    result = run_train(*team_config(tmp_path, differing_spaces="true"), f"+env.policy_groups={groups}", "runner=subproc",
                       run_dir=tmp_path / "run")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert message in result.stderr
    assert not (tmp_path / "run" / "stats.jsonl").exists()


def test_policy_groups_on_a_single_agent_env_is_one_line(tmp_path):
    result = run_train("+env=cartpole", "+env.policy_groups={a: [b]}", run_dir=tmp_path / "run")
    assert result.returncode == 2
    assert "env.policy_groups={...}: the env is not a multi-agent (PettingZoo) env" in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_groups_whose_actions_cannot_share_a_layout_are_one_line():
    spaces = {"a": (gym.spaces.Box(0, 1, (2,)), gym.spaces.Discrete(3)), "b": (gym.spaces.Box(0, 1, (2,)), gym.spaces.Box(-1, 1, (2,)))}
    with pytest.raises(EnvConfigError, match="neither the same nor all Discrete"):
        shared_action_space(spaces)
