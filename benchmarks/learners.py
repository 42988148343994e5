"""Several learners (`learner.num_learners`): what the all-reduce costs, and what N learners give.

    python benchmarks/learners.py overhead                  # the learner alone, N = 1, 2: MLP (CartPole) and CNN (MinAtar)
    python benchmarks/learners.py scaling --seconds 90      # MinAtar Breakout, IMPALA, torch_threads=1: env steps/s, N = 1, 2
    python benchmarks/learners.py solve --seeds 1 2 3       # CartPole to 475 with 2 learners, runner=subproc and runner=ray

overhead: each of N processes builds the run's learner (the shipped config of the env, plus the
overrides given) with its own batch collected by real actors, joins the others (gloo on loopback,
or NCCL with `--device cuda`) and times `--updates` updates; the all-reduce is timed inside each
update. N = 1 is the same learner without a group. Printed: updates/s of each learner, samples/s of
all of them together, and the all-reduce's milliseconds per update (median over the learners).

scaling: `train +env=minatar torch_threads=1 max_time_s=<seconds> eval.interval=0
learner.num_learners=N`, alternating N, steady env steps/s (median of the epochs after the first two).

solve: `train +env=cartpole learner.num_learners=2 runner=<runner> seed=<s> eval.interval=0` to its target
(the last 100 training episodes averaging 475): whole-process seconds and env steps, every seed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from machine import machine_line
from runs import run_train

CASES = {"mlp": ["+env=cartpole"], "cnn": ["+env=minatar"]}


def _build(overrides: list[str], group=None):
    """The run's learner (joined to `group`) and one real batch for it."""
    from maze_cli.cli.build import build_run, check_env
    from maze_cli.cli.paths import compose_train
    from maze_cli.cli.settings import validate

    cfg = compose_train([*overrides, "runner=sequential", "runner.n_actors=2", "learner.precision=fp32"])
    settings = validate(cfg, [])
    torch.set_num_threads(settings.train.torch_threads)
    torch.manual_seed(settings.train.seed)
    factory, obs_space, action_space = check_env(settings)
    run = build_run(settings, factory, obs_space, action_space, group=group)
    with run.runner:
        batch = run.runner.collect_outputs(run.learner.device)[0]
    return run.learner, batch


def _time_learner(rank: int, world_size: int, port: int, overrides: list[str], updates: int, results) -> None:
    group = None
    reduce_s = [0.0]
    if world_size > 1:
        from maze_cli.distributed import GroupSpec, LearnerGroup

        group = LearnerGroup(GroupSpec(rank, world_size, "127.0.0.1", port, 120.0))
        average = group.average_gradients

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            average(*args, **kwargs)
            reduce_s[0] += time.perf_counter() - t0

        group.average_gradients = timed
    learner, batch = _build(overrides, group)
    for _ in range(3):  # warm-up (and the learners meet in step)
        learner.update(batch)
    reduce_s[0] = 0.0
    t0 = time.perf_counter()
    for _ in range(updates):
        learner.update(batch)
    elapsed = time.perf_counter() - t0
    results.put((rank, updates / elapsed, batch.rewards.numel(), 1000 * reduce_s[0] / updates))
    if group is not None:
        group.close()


def overhead(args) -> str:
    from maze_cli.distributed import main_store

    lines = [f"### The learner alone with N learners ({machine_line()})", "",
             f"`python benchmarks/learners.py overhead --updates {args.updates}` (torch_threads=1 per learner, fp32, gloo on loopback)", "",
             "| network | N | updates/s per learner | samples/s, all learners | all-reduce ms per update |", "|---|---:|---:|---:|---:|"]
    context = mp.get_context("spawn")
    for name, overrides in CASES.items():
        overrides = [*overrides, "torch_threads=1"]
        for n in args.learners:
            store = main_store("127.0.0.1", n, 120.0) if n > 1 else None
            results = context.Queue()
            procs = [context.Process(target=_time_learner, args=(r, n, store.port if store else 0, overrides, args.updates, results))
                     for r in range(n)]
            for p in procs:
                p.start()
            got = [results.get(timeout=900) for _ in procs]
            for p in procs:
                p.join(30)
            rates = [g[1] for g in got]
            samples = got[0][2]
            reduce_ms = statistics.median(g[3] for g in got)
            line = (f"| {name} ({overrides[0]}) | {n} | {statistics.median(rates):.1f} ({', '.join(f'{r:.1f}' for r in rates)}) | "
                    f"{sum(rates) * samples:,.0f} | {reduce_ms:.2f} |")
            print(line, flush=True)
            lines.append(line)
    return "\n".join(lines)


def scaling(args) -> str:
    lines = [f"### MinAtar Breakout, IMPALA, `torch_threads=1`, {args.seconds:.0f} s a run ({machine_line()})", "",
             f"`python benchmarks/learners.py scaling --seconds {args.seconds:.0f} --rounds {args.rounds}`: "
             "`train +env=minatar torch_threads=1 max_time_s=<s> eval.interval=0 learner.num_learners=N`, N alternating", "",
             "| round | N | env steps/s (steady) | env steps | learner share of an epoch |", "|---:|---:|---:|---:|---:|"]
    rates: dict[int, list[float]] = {n: [] for n in args.learners}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for n in args.learners:
                run = run_train(["+env=minatar", "torch_threads=1", f"max_time_s={args.seconds}", "eval.interval=0",
                                 f"learner.num_learners={n}"], Path(tmp) / f"{i}-{n}", timeout_s=args.seconds + 300)
                sps = run.steady("sps")
                rates[n].append(sps)
                share = statistics.median(r["time/learner_s"] / r["time/epoch_s"] for r in run.rows[2:] or run.rows)
                line = f"| {i + 1} | {n} | {sps:,.0f} | {run.rows[-1]['env_steps']:,} | {share:.0%} |"
                print(line, flush=True)
                lines.append(line)
    base = statistics.median(rates[args.learners[0]])
    lines += ["", "| N | env steps/s (median) | against N = 1 |", "|---:|---:|---:|"]
    lines += [f"| {n} | {statistics.median(r):,.0f} | {statistics.median(r) / base:.2f}x |" for n, r in rates.items()]
    return "\n".join(lines)


def solve(args) -> str:
    lines = [f"### CartPole to 475 with 2 learners ({machine_line()})", "",
             f"`python benchmarks/learners.py solve --seeds {' '.join(map(str, args.seeds))}`: `train +env=cartpole "
             "learner.num_learners=2 runner=<runner> seed=<s> eval.interval=0` (the last 100 training episodes >= 475)", "",
             "| runner | seed | solved | whole process (s) | env steps | final window mean |", "|---|---:|---|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        for runner in args.runners:
            for seed in args.seeds:
                run = run_train(["+env=cartpole", "learner.num_learners=2", f"runner={runner}", f"seed={seed}", "eval.interval=0"],
                                Path(tmp) / f"{runner}-{seed}", timeout_s=600)
                last = run.rows[-1]
                line = (f"| {runner} | {seed} | {'yes' if run.solved else 'no'} | {run.wall_s:.1f} | {last['env_steps']:,} | "
                        f"{last.get('train/return_window_mean', float('nan')):.1f} |")
                print(line, flush=True)
                lines.append(line)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["overhead", "scaling", "solve"])
    parser.add_argument("--learners", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--runners", nargs="+", default=["subproc", "ray"])
    parser.add_argument("--out", type=Path, help="also append the Markdown here")
    args = parser.parse_args()
    text = {"overhead": overhead, "scaling": scaling, "solve": solve}[args.what](args)
    print("\n" + text)
    if args.out:
        with args.out.open("a") as f:
            f.write("\n\n" + text + "\n")


if __name__ == "__main__":
    sys.exit(main())
