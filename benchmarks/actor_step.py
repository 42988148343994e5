"""What one actor step costs: microseconds per step of a batch of envs, split into inference, env and
record (the actor's own `info.timings`), beside the raw env limit of the same batch measured in the
same run.

    .venv/bin/python benchmarks/actor_step.py                      # every case, ~10 s each
    .venv/bin/python benchmarks/actor_step.py --cases cartpole lstm --seconds 5 --repeats 3
    .venv/bin/python benchmarks/actor_step.py --profile cartpole   # cProfile of the actor loop instead

Each case builds an `Actor` (the loop every backend runs) as a subprocess actor does (torch on one
thread), collects rollouts of 32 steps in a loop and reports the median over rollouts of each part
per actor step. Cases (16 envs per actor, IMPALA's default, unless said):

    cartpole  CartPole-v1, gymnasium's vectorized CartPole; IMPALA's ActorCritic, MLP 64x64 tanh, two networks
    dict      CartPole-v1 with the previous action and reward as observation keys (a Dict observation;
              `policy.core_inputs`), single envs stepped in a loop
    pendulum  Pendulum-v1 (Box actions: a Gaussian head), observation normalization on (IMPALA's default there)
    lstm      CartPole-v1 with `core: lstm` (128 units), the state carried by the actor
    sac       Pendulum-v1 with SAC's SacPolicy (MLP 256x256 relu, tanh-squashed Gaussian), 8 envs

The raw limit steps the same env batch (the gymnasium vector env, or the single envs in a loop with
resets) with random actions and no policy; `of raw` is the actor's env steps/s over it. On a busy
machine, take medians of `--repeats` (each repeat measures every case once, the raw limit beside it).

Against another revision: unpack its package beside and put it first on the path, alternating runs
(the machine's load moves between them):

    git archive <rev> maze_cli | tar -x -C /tmp/base
    (cd /tmp && PYTHONPATH=/tmp/base /work/main/.venv/bin/python /work/main/benchmarks/actor_step.py)

Results: benchmarks/ACTING.md.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from maze_cli.envs import EnvFactory
from maze_cli.envs.batch import EnvList, VectorEnvBatch
from maze_cli.parallel.actor_loop import Actor
from maze_cli.policies import ActorCritic, mlp_network
from maze_cli.records import RolloutSpec, TensorSpec
from maze_cli.envs.spaces import action_spec, observation_specs

N_STEPS = 32


@dataclass
class Case:
    name: str
    env_config: dict
    make_policy: Callable  # (observation_space, action_space) -> Policy
    n_envs: int = 16


def actor_critic(network: dict, normalize_obs: bool = False) -> Callable:
    def make(observation_space, action_space):
        return ActorCritic(observation_space, action_space, network=network, shared_network=False, normalize_obs=normalize_obs)

    return make


def sac_policy(observation_space, action_space):
    from maze_cli.algorithms.sac import SacPolicy

    return SacPolicy(observation_space, action_space)


MLP = mlp_network((64, 64), "tanh")
CASES = {
    "cartpole": Case("cartpole", {"id": "CartPole-v1"}, actor_critic(MLP)),
    "dict": Case("dict", {"id": "CartPole-v1", "core_inputs": ["obs", "prev_action", "prev_reward"]}, actor_critic(MLP)),
    "pendulum": Case("pendulum", {"id": "Pendulum-v1"}, actor_critic(MLP, normalize_obs=True)),
    "lstm": Case("lstm", {"id": "CartPole-v1"}, actor_critic({**MLP, "core": "lstm"})),
    "sac": Case("sac", {"id": "Pendulum-v1"}, sac_policy, n_envs=8),
}


def build_actor(case: Case) -> tuple[Actor, object]:
    torch.manual_seed(0)
    factory = EnvFactory(case.env_config)
    probe = factory()
    policy = case.make_policy(probe.observation_space, probe.action_space)
    probe.close()
    actor = Actor(0, factory, policy, case.n_envs, N_STEPS, env_seed=1, agent_seed=2)
    spec = RolloutSpec(
        observations=observation_specs(policy.observation_space), action=action_spec(policy.action_space), n_steps=N_STEPS,
        n_envs=case.n_envs, state=tuple(TensorSpec(tuple(s.shape[1:]), s.dtype) for s in policy.initial_state(1)),
    )
    return actor, spec.allocate(shared=True)  # shared memory, as a subprocess actor writes into


def measure_actor(case: Case, seconds: float) -> dict[str, float]:
    """Median over rollouts of us per actor step: total (the whole collect), inference, env, record."""
    actor, record = build_actor(case)
    try:
        for _ in range(3):  # warm-up
            actor.collect(record)
        parts: dict[str, list[float]] = {"total": [], "inference": [], "env": [], "record": []}
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            info = actor.collect(record)
            parts["total"].append(time.perf_counter() - t0)
            parts["inference"].append(info.timings["actor_inference_s"])
            parts["env"].append(info.timings["actor_env_step_s"])
            parts["record"].append(info.timings["actor_record_s"])
        return {k: statistics.median(v) / N_STEPS * 1e6 for k, v in parts.items()}
    finally:
        actor.close()


def measure_raw(case: Case, seconds: float) -> float:
    """us per step of the same env batch with random actions, no policy (gymnasium alone)."""
    actor, _ = build_actor(case)
    envs = actor.envs
    rng = np.random.default_rng(0)
    space = envs.action_space
    n = case.n_envs
    if hasattr(space, "n"):
        actions = [rng.integers(0, int(space.n), size=n) + int(space.start) for _ in range(256)]
    else:
        actions = [rng.uniform(space.low, space.high, size=(n, *space.shape)).astype(space.dtype) for _ in range(256)]
    if isinstance(envs, VectorEnvBatch):
        step = envs.env.step
    else:
        assert isinstance(envs, EnvList)
        singles = envs.envs

        def step(batch):
            for env, a in zip(singles, batch):
                _, _, term, trunc, _ = env.step(a.item() if a.ndim == 0 else a)
                if term or trunc:
                    env.reset()
    try:
        times = []
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            for a in actions[:N_STEPS]:
                step(a)
            times.append((time.perf_counter() - t0) / N_STEPS)
        return statistics.median(times) * 1e6
    finally:
        actor.close()


def profile(case: Case, seconds: float) -> None:
    actor, record = build_actor(case)
    actor.collect(record)
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    while time.perf_counter() - start < seconds:
        actor.collect(record)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    actor.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement (actor, then raw env)")
    parser.add_argument("--repeats", type=int, default=1, help="measure every case this many times; medians reported")
    parser.add_argument("--profile", choices=list(CASES), help="cProfile one case's actor loop and exit")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as in an actor subprocess
    if args.profile:
        profile(CASES[args.profile], args.seconds)
        return
    import maze_cli

    print(f"maze_cli from {maze_cli.__file__}", file=sys.stderr)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in args.cases}
    for repeat in range(args.repeats):
        for name in args.cases:
            case = CASES[name]
            row = measure_actor(case, args.seconds)
            row["raw"] = measure_raw(case, args.seconds / 2)
            results[name].append(row)
            print(f"repeat {repeat} {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), file=sys.stderr, flush=True)
    print(f"\nus per actor step (median over rollouts of {N_STEPS} steps; median of {args.repeats} repeats)\n")
    print("| case | envs | total | inference | env | record | raw env | actor env steps/s | raw env steps/s | of raw |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, rows in results.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        n = CASES[name].n_envs
        actor_sps, raw_sps = n / med["total"] * 1e6, n / med["raw"] * 1e6
        print(f"| {name} | {n} | {med['total']:.1f} | {med['inference']:.1f} | {med['env']:.1f} | {med['record']:.1f} | "
              f"{med['raw']:.1f} | {actor_sps:,.0f} | {raw_sps:,.0f} | {actor_sps / raw_sps:.2f} |")


if __name__ == "__main__":
    main()
