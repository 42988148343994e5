"""PPO's learner threads: env steps/s with one torch thread in the learner's process against `torch_threads=null`
(every core while the actors wait for the update), on one env of each kind, settings alternated per round.

    python benchmarks/learner_threads.py                          # every task, 60 s a run, 2 rounds
    python benchmarks/learner_threads.py --tasks cartpole halfcheetah --seconds 90 --rounds 3

Each run is `train <task> algorithm=ppo torch_threads=<setting> max_time_s=<seconds> eval.interval=0
target_return=null`; its figure is the median env steps/s over its epochs after the first two (start-up), and
the env steps the whole budget held. Run it alone on the machine: the figures are timings.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from machine import machine_line
from runs import publish, run_train
from suite import HELDOUT, SUITE, write_env_configs

HERE = Path(__file__).resolve().parent
TASKS = {
    "cartpole": SUITE["cartpole"].overrides,  # vector observations, discrete actions
    "pendulum": SUITE["pendulum"].overrides,  # Box actions
    "goalgrid": SUITE["goalgrid"].overrides,  # Dict observations
    "repeat2": SUITE["repeat2"].overrides,  # memory: the LSTM core
    "minatar": SUITE["minatar"].overrides,  # pixels: the CNN
    "reference": HELDOUT["reference"].overrides,  # two agents
    "halfcheetah": ("+env=mujoco", "env.id=HalfCheetah-v5"),  # MuJoCo (needs the mujoco extra)
    "connect_four": ("+env=connect_four",),  # turn-based self-play (needs the pettingzoo extra)
}
SETTINGS = ("1", "null")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=list(TASKS))
    parser.add_argument("--seconds", type=float, default=60.0, help="max_time_s of each run")
    parser.add_argument("--rounds", type=int, default=2, help="runs per task and setting, the settings alternated")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rates: dict[tuple[str, str], list[float]] = {}
    steps: dict[tuple[str, str], list[int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        config_dir = write_env_configs(Path(tmp) / "conf")
        for task in args.tasks:
            for round_ in range(args.rounds):
                order = SETTINGS if round_ % 2 == 0 else SETTINGS[::-1]
                for setting in order:
                    overrides = [*TASKS[task], "algorithm=ppo", f"torch_threads={setting}", f"max_time_s={args.seconds}",
                                 "max_env_steps=1000000000", "eval.interval=0", "target_return=null", "seed=1",
                                 f"hydra.searchpath=[file://{config_dir}]"]
                    run = run_train(overrides, Path(tmp) / f"{task}-{setting}-{round_}", pythonpath=HERE)
                    rates.setdefault((task, setting), []).append(run.steady("sps"))
                    steps.setdefault((task, setting), []).append(run.rows[-1]["env_steps"])
                    print(f"{task} torch_threads={setting} round {round_ + 1}: {rates[task, setting][-1]:,.0f} env steps/s, "
                          f"{steps[task, setting][-1]:,} env steps", flush=True)
    lines = [f"`python benchmarks/learner_threads.py --tasks {' '.join(args.tasks)} --seconds {args.seconds:g} "
             f"--rounds {args.rounds}`; {machine_line()}.", "",
             "| task | env steps/s, torch_threads=1 (each round) | env steps/s, torch_threads=null (each round) | ratio of medians | "
             "env steps in the budget, 1 / null (medians) |",
             "|---|---|---|---:|---|"]
    for task in args.tasks:
        one, auto = rates[task, "1"], rates[task, "null"]
        ratio = statistics.median(auto) / statistics.median(one)
        lines.append(f"| {task} | {', '.join(f'{r:,.0f}' for r in one)} | {', '.join(f'{r:,.0f}' for r in auto)} | {ratio:.2f} | "
                     f"{statistics.median(steps[task, '1']):,.0f} / {statistics.median(steps[task, 'null']):,.0f} |")
    publish(lines, args.out)


if __name__ == "__main__":
    main()
