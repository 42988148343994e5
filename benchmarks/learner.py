"""The learner alone: updates per second at each precision, compiled or not, on real batches.

    python benchmarks/learner.py +env=minatar                          # IMPALA, the shipped MinAtar settings
    python benchmarks/learner.py +env=atari --variants fp32 bf16       # Pong's nature CNN (needs the atari extra)
    python benchmarks/learner.py +env=cartpole algorithm=ppo --variants fp32 compile
    python benchmarks/learner.py +env=pendulum algorithm=sac --updates 200
    python benchmarks/learner.py +env=minatar device=cuda --variants fp32 bf16 compile-bf16 compile-bf16-cudagraphs

Each variant (`fp32`, `bf16`, `compile` = fp32 with the loss functions compiled, `compile-bf16`,
`compile-bf16-cudagraphs` = compile mode reduce-overhead, `compile-update` = fp32 with the whole update, loss,
backward and optimizer step, under one torch.compile as LeanRL does, `compile-step` = the loss compiled and, apart,
its backward, clipping and optimizer step; both with torch's capturable Adam) gets a learner built from the
same composed config (the shipped defaults and tuning files, plus the overrides given) and seed, and one
batch collected by real actors (runner=sequential; SAC: a replay buffer filled by its initial policy).
Then rounds alternate between the variants: each round times `--updates` updates of every variant in
turn, so a machine's noise hits all of them alike. Printed: the median updates/s and samples/s over
the rounds (every round's figure too), and how long the first call (compilation) took. On a GPU each
timing waits for the device to finish its updates. A variant that cannot run here is reported and skipped.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

VARIANTS = {
    "fp32": ["learner.precision=fp32"],
    "bf16": ["learner.precision=bf16"],
    "compile": ["learner.precision=fp32", "learner.compile=true"],
    "compile-bf16": ["learner.precision=bf16", "learner.compile=true"],
    "compile-bf16-cudagraphs": ["learner.precision=bf16", "learner.compile=true", "learner.compile_mode=reduce-overhead"],
    "compile-update": ["learner.precision=fp32"],  # the whole update (loss, backward, Adam) under one torch.compile
    "compile-step": ["learner.precision=fp32", "learner.compile=true"],  # the loss compiled, and backward + clip + Adam
}
WHOLE_UPDATE = {"compile-update": "update", "compile-step": "step"}


def build(overrides: list[str], whole_update: str | None = None):
    """The run's learner, and a function that makes one update on a fixed real batch."""
    from maze_cli.cli.build import build_run, check_env
    from maze_cli.cli.paths import compose_train
    from maze_cli.cli.settings import validate

    cfg = compose_train([*overrides, "runner=sequential", "runner.n_actors=2"])
    settings = validate(cfg, [])
    torch.set_num_threads(settings.train.torch_threads)
    torch.manual_seed(settings.train.seed)
    factory, obs_space, action_space = check_env(settings)
    run = build_run(settings, factory, obs_space, action_space)
    learner = run.learner
    with run.runner:
        if hasattr(run.runner, "sample_batch"):  # SAC: a buffer filled by the initial policy
            run.runner.init_replay_buffer()
            batch = run.runner.sample_batch(learner.device)
        else:
            batch = run.runner.collect_outputs(learner.device)[0]
    samples = len(batch.transitions) if hasattr(batch, "transitions") else batch.rewards.numel()

    # LeanRL's way: one torch.compile over everything an update does, the learner's bookkeeping
    # included; dynamo breaks the graph where it must (the objective's steps, host reads) and compiles the rest.
    # Its optimizer is torch's Adam, capturable (its step count a tensor, as LeanRL's): the learner's
    # own calls a fused kernel that inductor cannot trace.
    if whole_update:
        for group in learner.groups.values():
            adam = group.optimizer.param_groups[0]
            group.optimizer = torch.optim.Adam(adam["params"], lr=adam["lr"], eps=adam["eps"], capturable=True)
    if whole_update == "step":  # what follows the compiled loss: its backward, the clip and Adam's step
        learner.step = torch.compile(learner.step, dynamic=False)
    update = torch.compile(learner.update, dynamic=False) if whole_update == "update" else learner.update

    def updates(n: int) -> None:
        """`n` updates, to their end: a GPU runs them asynchronously, so wait for it before the clock is read."""
        for _ in range(n):
            update(batch)
        if learner.device.type == "cuda":
            torch.cuda.synchronize(learner.device)

    return learner, updates, samples, settings.train.torch_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="+", help="train's overrides, e.g. +env=minatar algorithm=ppo")
    parser.add_argument("--variants", nargs="+", default=["fp32", "bf16", "compile"], choices=sorted(VARIANTS))
    parser.add_argument("--updates", type=int, default=20, help="updates timed per variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    learners = {}
    for name in args.variants:
        try:
            learner, updates, samples, threads = build([*args.overrides, *VARIANTS[name]], WHOLE_UPDATE.get(name))
            t0 = time.perf_counter()
            updates(2)  # the first call: compilation, autocast's caches
        except Exception as error:  # one variant this torch or device cannot run: report it, time the others
            print(f"{name}: failed: {type(error).__name__}: {str(error)[:500]}", flush=True)
            continue
        learner.metrics.clear()
        learners[name] = (updates, samples, time.perf_counter() - t0)
        print(f"{name}: first two updates {learners[name][2]:.1f} s (precision {learner.precision})", flush=True)
    if not learners:
        raise SystemExit("no variant could run")
    rates: dict[str, list[float]] = {name: [] for name in learners}
    for _ in range(args.rounds):
        for name, (updates, _, _) in learners.items():
            t0 = time.perf_counter()
            updates(args.updates)
            rates[name].append(args.updates / (time.perf_counter() - t0))
    print(f"\n{' '.join(args.overrides)}: {args.updates} updates x {args.rounds} rounds, torch threads {threads}")
    print("| variant | updates/s (median) | samples/s | every round | first two updates (s) |")
    print("|---|---:|---:|---|---:|")
    base = statistics.median(next(iter(rates.values())))
    for name, (_, samples, first_s) in learners.items():
        median = statistics.median(rates[name])
        every = ", ".join(f"{r:.2f}" for r in rates[name])
        print(f"| {name} | {median:.2f} ({median / base:.2f}x) | {median * samples:,.0f} | {every} | {first_s:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
