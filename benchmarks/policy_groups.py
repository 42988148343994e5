"""Policy groups on MPE's simple_adversary (or simple_tag): one policy per kind of agent (`env.policy_groups`)
against one policy shared by all agents, each group judged against random play and against the other
setup's opponents.

    python benchmarks/policy_groups.py run --env simple_adversary --seeds 1 2 3 4 5 --agent-steps 1000000
    python benchmarks/policy_groups.py report --env simple_adversary --out /tmp/table.md

Per seed, two runs of PPO with the same settings and agent-step budget:

- `groups`: `+env=<env>` with its config's groups (adversaries, good agents), one policy each;
- `shared`: one policy for all agents on the same observations (`shared_layout` below: each agent's
  observation under its kind's key, zeros under the other's, and its kind's index), so the shared policy
  sees everything a group's policy sees, and which kind it plays.

Then each run's final policy plays 200 episodes (greedy actions, env seeds 0-199) in every matchup of
the adversaries' policy against the good agents' policy among {groups, shared, random}; a kind's return is
the mean over its agents. Every matchup of every seed is appended to benchmarks/results/policy_groups.jsonl.
"""

from __future__ import annotations

import argparse
import importlib
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from machine import machine_line
from runs import publish, run_train
from scores import iqm_with_interval

RESULTS = Path(__file__).parent / "results" / "policy_groups.jsonl"
GROUPS = {"adversaries": ["adversary_*"], "good": ["agent_*"]}
ENV_ARGUMENTS = {"simple_adversary": {"N": 2, "max_cycles": 25, "continuous_actions": False},
                 "simple_tag": {"num_good": 1, "num_adversaries": 3, "num_obstacles": 2, "max_cycles": 25, "continuous_actions": False}}
PPO = ["algorithm=ppo", "algorithm.entropy_coef=0.01", "algorithm.lr=7.0e-4", "runner.envs_per_actor=12"]
EPISODES = 200


def grouped_env(name: str, **arguments: Any) -> Any:
    """The env in the rows' layout of `env.policy_groups` (maze_cli.envs.policy_groups), GROUPS as its groups."""
    from maze_cli.envs.policy_groups import PolicyGroupObservation

    module = importlib.import_module(f"mpe2.{name}_v3")
    return PolicyGroupObservation(module.parallel_env(**arguments), GROUPS)


def shared_layout(name: str, **arguments: Any) -> Any:
    """`grouped_env` as a PettingZoo ParallelEnv whose agents all have the same spaces: a shared policy trains on it."""
    from pettingzoo import ParallelEnv

    class SharedLayout(ParallelEnv):
        metadata = {"name": f"{name}_shared_layout"}

        def __init__(self):
            self.inner = grouped_env(name, **arguments)
            self.possible_agents = self.inner.possible_agents

        @property
        def agents(self):
            return self.inner.agents

        def observation_space(self, agent):
            return self.inner.observation_space(agent)

        def action_space(self, agent):
            return self.inner.action_space(agent)

        def reset(self, seed=None, options=None):
            return self.inner.reset(seed=seed, options=options)

        def step(self, actions):
            return self.inner.step(actions)

        def render(self):
            return self.inner.render()

        def close(self):
            self.inner.close()

    return SharedLayout()


def train(env: str, setup: str, seed: int, agent_steps: int, workdir: Path) -> Path:
    """One PPO run; returns its last checkpoint."""
    run_dir = workdir / f"{setup}-{seed}"
    if setup == "groups":
        overrides = [f"+env={env}"]
    else:
        config_dir = workdir / "configs" / "env"
        config_dir.mkdir(parents=True, exist_ok=True)
        lines = "".join(f"  {k}: {str(v).lower() if isinstance(v, bool) else v}\n" for k, v in ENV_ARGUMENTS[env].items())
        (config_dir / "shared.yaml").write_text(f"# @package _global_\nenv:\n  _target_: policy_groups.shared_layout\n"
                                                f"  name: {env}\n{lines}target_return: null\n")
        overrides = ["--config-dir", str(workdir / "configs"), "+env=shared"]
    overrides += [*PPO, f"seed={seed}", f"max_env_steps={agent_steps}", "target_return=null", "eval.episodes=20"]
    run = run_train(overrides, run_dir, timeout_s=3600, pythonpath=Path(__file__).parent)
    print(f"{setup} seed {seed}: {run.rows[-1]['env_steps']:,} agent steps in {run.wall_s:.0f} s", flush=True)
    return run_dir / "checkpoints" / "last.pt"


def play(env_name: str, adversaries: Any, good: Any, episodes: int = EPISODES) -> dict[str, float]:
    """Mean return per agent of each kind, the adversaries acting with `adversaries`, the good agents with
    `good` (a policy, or None: uniform random), greedy actions, env seeds 0..episodes-1."""
    from maze_cli.envs.spaces import ObservationWriter, observation_specs

    env = grouped_env(env_name, **ENV_ARGUMENTS[env_name])
    agents = env.possible_agents
    kind = {a: env.agent_groups[a] for a in agents}
    space = env.observation_space(agents[0])
    writer, specs = ObservationWriter(space), observation_specs(space)
    rng = np.random.default_rng(0)
    totals = {"adversaries": 0.0, "good": 0.0}
    for seed in range(episodes):
        observations, _ = env.reset(seed=seed)
        while env.agents:
            live = list(env.agents)
            batch = {k: torch.zeros((len(live),) + s.shape, dtype=s.dtype) for k, s in specs.items()}
            writer.write([observations[a] for a in live], batch)
            actions = {}
            for who, policy in (("adversaries", adversaries), ("good", good)):
                rows = [i for i, a in enumerate(live) if kind[a] == who]
                if policy is None:
                    chosen = rng.integers(env.action_space(live[0]).n, size=len(rows))
                else:
                    with torch.no_grad():
                        chosen = policy.act(batch, (), None, deterministic=True)[0][rows].numpy()
                actions.update({live[i]: int(c) for i, c in zip(rows, chosen)})
            observations, rewards, _, _, _ = env.step(actions)
            for a, r in rewards.items():
                totals[kind[a]] += r / sum(1 for b in agents if kind[b] == kind[a])
    env.close()
    return {k: v / episodes for k, v in totals.items()}


def run(args: argparse.Namespace) -> None:
    from maze_cli.checkpoint import load_policy

    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as tmp:
            policies = {setup: load_policy(train(args.env, setup, seed, args.agent_steps, Path(tmp)))
                        for setup in ("groups", "shared")}
            policies["random"] = None
            for adversaries in ("groups", "shared", "random"):
                for good in ("groups", "shared", "random"):
                    returns = play(args.env, policies[adversaries], policies[good])
                    row = {"env": args.env, "seed": seed, "agent_steps": args.agent_steps, "adversaries": adversaries,
                           "good": good, **{f"{k}_return": round(v, 3) for k, v in returns.items()}, "machine": machine_line()}
                    print(json.dumps(row), flush=True)
                    with RESULTS.open("a") as f:
                        f.write(json.dumps(row) + "\n")


def report(args: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines()]
    rows = [r for r in rows if r["env"] == args.env]
    lines = [f"{args.env}: mean return per agent of each kind, {EPISODES} greedy episodes per seed; every seed, then the mean "
             "and IQM with 95% bootstrap intervals (rliable)", "",
             "| adversaries' policy | good agents' policy | kind | every seed | mean [95% CI] | IQM [95% CI] |", "|---|---|---|---|---|---|"]
    for adversaries in ("groups", "shared", "random"):
        for good in ("groups", "shared", "random"):
            matchup = sorted((r for r in rows if r["adversaries"] == adversaries and r["good"] == good), key=lambda r: r["seed"])
            for who in ("adversaries", "good"):
                values = [r[f"{who}_return"] for r in matchup]
                if not values:
                    continue
                every = ", ".join(f"s{r['seed']}: {v:.2f}" for r, v in zip(matchup, values))
                if len(values) > 1:
                    mean, iqm, iqm_lo, iqm_hi, (mean_lo, mean_hi) = iqm_with_interval(values)
                    stats = f"{mean:.2f} [{mean_lo:.2f}, {mean_hi:.2f}] | {iqm:.2f} [{iqm_lo:.2f}, {iqm_hi:.2f}]"
                else:
                    stats = f"{values[0]:.2f} | -"
                lines.append(f"| {adversaries} | {good} | {who} | {every} | {stats} |")
    publish(lines, args.out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run")
    one.add_argument("--env", default="simple_adversary", choices=sorted(ENV_ARGUMENTS))
    one.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    one.add_argument("--agent-steps", type=int, default=1_000_000)
    out = sub.add_parser("report")
    out.add_argument("--env", default="simple_adversary", choices=sorted(ENV_ARGUMENTS))
    out.add_argument("--out", type=Path)
    args = parser.parse_args()
    (run if args.command == "run" else report)(args)


if __name__ == "__main__":
    main()
