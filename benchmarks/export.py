"""Exported policies (`export-policy`): parity with the trained policy, export time and size, and the latency
of one greedy action through onnxruntime against torch.

    python benchmarks/export.py --out benchmarks/results/export.md

Parity: for each policy kind and algorithm, a short real run (`runner=sequential`), exported to ONNX and to
TorchScript with the export's own check (1,000 observations; recurrent policies: whole episodes); its largest
absolute difference of every output, and the mean return of `rollout` over the same 10 env seeds for the
checkpoint and for the ONNX model. Export time is the whole command's work in-process (trace, write, check).

Latency: one greedy action at batch 1 and 256, one thread everywhere (as an actor acts): onnxruntime on the
exported model, torch eager (`policy.act`, what actors and `rollout` call) and torch.compile (the exported
graph compiled), for the MLP of the CartPole run and an untrained nature CNN on 84 x 84 x 4 uint8 frames. The
three are measured in turns, round after round, and compared as ratios within the run: the machine may be
shared with other work.

Acting: what an actor's inference would cost through onnxruntime: a sampled action and its log-prob for 16
CartPoles (an actor's envs), torch's `policy.act` against onnxruntime's logits and a Gumbel-max draw in numpy.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from machine import commit, machine_line, version
from runs import publish, run_train

SHORT = ["runner=sequential", "eval.episodes=1", "eval.interval=0", "target_return=null"]
# name -> (train overrides, env steps, policy group)
KINDS: dict[str, tuple[list[str], int, str | None]] = {
    "IMPALA, MLP, Discrete (CartPole)": (["+env=cartpole", "algorithm=impala"], 30_000, None),
    "IMPALA, LSTM core (CartPole)": (["+env=cartpole", "algorithm=impala", "policy.core=lstm"], 30_000, None),
    "PPO, GRU core (CartPole)": (["+env=cartpole", "algorithm=ppo", "policy.core=gru"], 30_000, None),
    "APPO, Dict + action mask (masked_choice)": (["+env=masked_choice", "algorithm=appo"], 30_000, None),
    "PPO, Box, observation normalization (Pendulum)": (["+env=pendulum", "algorithm=ppo", "+algorithm.normalize_obs=true"], 30_000, None),
    "IMPALA, CNN, bool frames (MinAtar Breakout)": (["+env=minatar", "env.id=MinAtar/Breakout-v1", "algorithm=impala"], 30_000, None),
    "SAC, Box (Pendulum)": (["+env=pendulum", "algorithm=sac"], 3_000, None),
    "TD3, Box (Pendulum)": (["+env=pendulum", "algorithm=td3"], 3_000, None),
    "DQN (CartPole)": (["+env=cartpole", "algorithm=dqn"], 10_000, None),
    "policy groups: adversaries (simple_adversary)": (["+env=simple_adversary"], 20_000, "adversaries"),
    "policy groups: good (simple_adversary)": (["+env=simple_adversary"], 20_000, "good"),
    "self-play, current policy (Connect Four)": (["+env=connect_four", "selfplay.pool_size=2"], 20_000, None),
}
BATCHES = (1, 256)
ACTOR_ENVS = 16
ROUNDS = 7
ROUND_S = 0.3  # seconds of calls per backend, batch and round


def parity_rows(workdir: Path) -> list[str]:
    from maze_cli.cli.rollout import RolloutConfig, run_rollout
    from maze_cli.export.exporter import export_checkpoint

    lines = ["| policy | env steps | max abs difference per output (ONNX) | same with TorchScript | return: checkpoint / ONNX model (10 episodes) | "
             "export s: ONNX / TorchScript | size KiB: ONNX / TorchScript |", "|---|---:|---|---|---|---|---|"]
    runs: dict[tuple[str, ...], Path] = {}
    for name, (overrides, steps, group) in KINDS.items():
        key = (*overrides, str(steps))
        if key not in runs:
            run_dir = workdir / f"run{len(runs)}"
            run_train([*SHORT, *overrides, f"max_env_steps={steps}"], run_dir, timeout_s=1800)
            runs[key] = run_dir / "checkpoints" / "last.pt"
        checkpoint = runs[key]
        exported, seconds = {}, {}
        for fmt, suffix in (("onnx", "onnx"), ("torchscript", "pt")):
            start = time.perf_counter()
            exported[fmt] = export_checkpoint(checkpoint, fmt, workdir / f"{len(runs)}-{group}.{suffix}", 1000, group=group)
            seconds[fmt] = time.perf_counter() - start
        discrete = "Box" not in name
        returns = "a group's model: not played alone"
        if group is None:
            with contextlib.redirect_stdout(io.StringIO()):
                of_checkpoint = run_rollout(RolloutConfig(checkpoint=str(checkpoint), episodes=10))
                of_model = run_rollout(RolloutConfig(model=str(exported["onnx"].path), episodes=10))
            returns = " / ".join(_headline(result) for result in (of_checkpoint, of_model))

        def differences(fmt: str) -> str:
            differences = exported[fmt].parity.max_difference
            return ", ".join("actions the same" if k == "action" and not v and discrete else f"{k} {v:.1e}" for k, v in differences.items())

        lines.append(f"| {name} | {steps:,} | {differences('onnx')} ({exported['onnx'].parity.observations:,} obs) | "
                     f"{differences('torchscript')} | {returns} | {seconds['onnx']:.1f} / {seconds['torchscript']:.1f} | "
                     f"{exported['onnx'].size / 1024:.1f} / {exported['torchscript'].size / 1024:.1f} |")
        print(lines[-1], flush=True)
    return lines


def _headline(result: dict[str, float]) -> str:
    """A rollout's mean return, or a game's win rate against the lookahead opponent."""
    if "return_mean" in result:
        return f"{result['return_mean']:.2f}"
    return f"win rate {result['win_rate/lookahead']:.2f} vs lookahead"


def _nature_cnn_policy():
    from maze_cli.policies.actor_critic import ActorCritic

    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    network = {"_target_": "maze_cli.policies.cnn.CnnNetwork", "encoder": "nature", "hidden_sizes": [512]}
    return ActorCritic(space, gym.spaces.Discrete(6), network=network, shared_network=True).eval()


def _mlp_policy(workdir: Path):
    from maze_cli.checkpoint import load_policy

    checkpoint = workdir / "run0" / "checkpoints" / "last.pt"
    if not checkpoint.is_file():
        run_train([*SHORT, "+env=cartpole", "algorithm=impala", "max_env_steps=2000"], workdir / "run0")
    return load_policy(checkpoint).eval()


def _onnx_and_batch(policy, workdir: Path, batch: int, name: str):
    """(graph, an onnxruntime session of one thread on it, feeds and torch tensors of `batch` observations
    sampled from the policy's space)."""
    import onnxruntime as ort

    from maze_cli.envs.spaces import observation_specs
    from maze_cli.export.contract import raw_batch
    from maze_cli.export.formats import write_model
    from maze_cli.export.graph import PolicyGraph
    from maze_cli.export.heads import head_for

    graph = PolicyGraph(head_for(policy, name)).eval()
    path = workdir / f"{name}.onnx"
    if not path.is_file():
        write_model(graph, "onnx", path, {})
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    space = policy.observation_space
    space.seed(0)
    raw = [space.sample() for _ in range(batch)]
    feeds = raw_batch(raw, graph.inputs, False)
    tensors = {k: torch.as_tensor(np.stack(raw)).to(s.dtype) for k, s in observation_specs(space).items()}
    return graph, session, feeds, tensors


def _backends(policy, workdir: Path, batch: int, name: str) -> dict[str, callable]:
    """One greedy action of `batch` observations through each backend, as a function of no arguments."""
    graph, session, feeds, tensors = _onnx_and_batch(policy, workdir, batch, name)
    inputs = tuple(torch.from_numpy(feeds[i.name]) for i in graph.inputs)
    compiled = torch.compile(graph, dynamic=False)
    with torch.inference_mode():
        compiled(*inputs)  # compiled before it is timed

    def eager():
        with torch.inference_mode():
            policy.act(tensors, (), None, deterministic=True)

    def compiled_call():
        with torch.inference_mode():
            compiled(*inputs)

    return {"onnxruntime": lambda: session.run(["action"], feeds), "torch eager": eager, "torch.compile": compiled_call}


def _median_call_s(call) -> float:
    times, end = [], time.perf_counter() + ROUND_S
    while time.perf_counter() < end or len(times) < 5:
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def latency_rows(workdir: Path) -> list[str]:
    torch.set_num_threads(1)
    lines = ["| policy | batch | onnxruntime ms | torch eager ms | torch.compile ms | torch eager / onnxruntime | torch.compile / onnxruntime |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, policy in (("MLP 64x64 tanh, and a value net (CartPole)", _mlp_policy(workdir)), ("nature CNN, 84x84x4 uint8", _nature_cnn_policy())):
        for batch in BATCHES:
            backends = _backends(policy, workdir, batch, name.split()[0].lower())
            rounds = {backend: [] for backend in backends}
            for _ in range(ROUNDS):  # in turns: a load that comes and goes weighs on all three alike
                for backend, call in backends.items():
                    rounds[backend].append(_median_call_s(call))
            ms = {backend: 1000 * statistics.median(values) for backend, values in rounds.items()}
            lines.append(f"| {name} | {batch} | {ms['onnxruntime']:.3f} | {ms['torch eager']:.3f} | {ms['torch.compile']:.3f} | "
                         f"{ms['torch eager'] / ms['onnxruntime']:.1f}x | {ms['torch.compile'] / ms['onnxruntime']:.1f}x |")
            print(lines[-1], flush=True)
    return lines


def _sampled_with_log_prob(logits: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A sampled action per row and its log-prob, as `Categorical.sample_with_log_prob` draws them (Gumbel-max)."""
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    actions = np.argmax(logp - np.log(rng.exponential(size=logp.shape)), axis=-1)
    return actions, np.take_along_axis(logp, actions[:, None], -1)[:, 0]


def acting_rows(workdir: Path) -> list[str]:
    torch.set_num_threads(1)
    policy = _mlp_policy(workdir)
    _, session, feeds, tensors = _onnx_and_batch(policy, workdir, ACTOR_ENVS, "mlp")
    rng = np.random.default_rng(0)

    def eager():
        with torch.inference_mode():
            policy.act(tensors, (), None, deterministic=False)

    backends = {"onnxruntime": lambda: _sampled_with_log_prob(session.run(["logits"], feeds)[0], rng), "torch eager": eager}
    rounds = {backend: [] for backend in backends}
    for _ in range(ROUNDS):
        for backend, call in backends.items():
            rounds[backend].append(_median_call_s(call))
    us = {backend: 1e6 * statistics.median(values) for backend, values in rounds.items()}
    return ["| policy | envs | torch eager us | onnxruntime + numpy sampling us | torch eager / onnxruntime |", "|---|---:|---:|---:|---:|",
            f"| MLP 64x64 tanh (CartPole), sampled action and log-prob | {ACTOR_ENVS} | {us['torch eager']:.0f} | {us['onnxruntime']:.0f} | "
            f"{us['torch eager'] / us['onnxruntime']:.1f}x |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the Markdown report here")
    parser.add_argument("--parts", nargs="+", choices=("parity", "latency", "acting"), default=["parity", "latency", "acting"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        lines = [f"{time.strftime('%Y-%m-%d')}, {machine_line()}, onnxruntime {version('onnxruntime')}, commit {commit()}", ""]
        if "parity" in args.parts:
            lines += ["### Parity, export time and size", "", *parity_rows(workdir), ""]
        if "latency" in args.parts:
            lines += ["### Latency of one greedy action, one thread", "", *latency_rows(workdir), ""]
        if "acting" in args.parts:
            lines += ["### An actor's inference, one thread", "", *acting_rows(workdir)]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
