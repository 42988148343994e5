"""MinAtar at maze_cli's defaults against a published table: gymnax's PPO checkpoints at 10M env steps.

    pip install -c constraints.txt -e '.[minatar,bench]'
    python benchmarks/minatar.py run --seeds 1 2 3 4 5                  # 5 games x 5 seeds, seed-major
    python benchmarks/minatar.py run --seeds 1 --games Asterix --env-steps 200000 --results /tmp/m.jsonl   # a smoke test
    python benchmarks/minatar.py report --out /tmp/minatar.md --plot docs/results/minatar.png

`run`: `train +env=minatar env.id=MinAtar/<game>-v1 max_env_steps=<env steps> seed=<s>` plus `--override`s and
nothing else, one process at a time, seed-major (a table stopped halfway still has whole seeds). A run's score
is its last evaluation (maze_cli evaluates at its last epoch: `eval.episodes` episodes, the most likely action),
as gymnax's figure is its checkpoint's return at 10M env steps. Each run appends one JSON line to
benchmarks/results/minatar.jsonl, its evaluation curve included; a failed run is recorded with its error.

`report`: per game every seed's score, the mean and IQM over seeds with 95% bootstrap intervals (rliable), the
mean of each seed's last three evaluations beside it, gymnax's figure and whether the mean is at or above it; the bar
is at or above on 3 of the 4 games gymnax reports. Seaquest, which gymnax does not implement, stands beside.
Breakout and SpaceInvaders chose the MinAtar settings (benchmarks/PIXELS.md); Asterix, Freeway and Seaquest
are held out.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import machine_line  # noqa: E402
from figures import finish_grid  # noqa: E402
from runs import publish, run_train  # noqa: E402
from scores import iqm_with_interval  # noqa: E402
from zoo import code_version, save  # noqa: E402

RESULTS = HERE / "results" / "minatar.jsonl"
# gymnax's README, its table of PPO checkpoints trained for 10M env steps (the MinAtar rows)
GYMNAX = {"Asterix": 15.0, "Breakout": 28.0, "Freeway": 58.0, "SpaceInvaders": 131.0}
GAMES = [*GYMNAX, "Seaquest"]
BAR = 3  # games of GYMNAX at or above its figure


def run(args) -> None:
    import yaml

    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="minatar-runs-"))
    print(f"run dirs under {runs_dir}", flush=True)
    jobs = [(seed, game) for seed in args.seeds for game in args.games]
    for i, (seed, game) in enumerate(jobs, 1):
        overrides = ["+env=minatar", f"env.id=MinAtar/{game}-v1", f"max_env_steps={args.env_steps}", f"seed={seed}",
                     *args.override]
        run_dir = runs_dir / args.label / game / f"seed{seed}"
        record = dict(label=args.label, game=game, seed=seed, budget=args.env_steps, overrides=args.override,
                      run_dir=str(run_dir), machine=machine_line(), commit=code_version(),
                      command=shlex.join(["train", *overrides, f"hydra.run.dir={run_dir}"]))
        start = time.perf_counter()
        try:
            result = run_train(overrides, run_dir, timeout_s=args.timeout_h * 3600)
            curve = result.eval_curve()
            algorithm = yaml.safe_load((run_dir / "config.yaml").read_text())["algorithm"]["_target_"]
            record.update(score=curve[-1][1], last3=statistics.fmean(v for _, v in curve[-3:]),
                          env_steps=result.rows[-1]["env_steps"], wall_s=result.wall_s, algorithm=algorithm, curve=curve)
            line = f"{record['score']:.1f} at {record['env_steps']:,} env steps, {record['wall_s']:.0f} s ({algorithm})"
        except (SystemExit, Exception) as error:  # recorded, and the table goes on
            record.update(error=str(error)[-3000:] or type(error).__name__, wall_s=time.perf_counter() - start)
            line = f"FAILED after {record['wall_s']:.0f} s"
        save(record, args.results)
        print(f"[{i}/{len(jobs)}] {args.label} {game} seed {seed}: {line}", flush=True)


def load(results: Path, label: str) -> dict[str, dict[int, dict]]:
    """game -> seed -> record of one label (a seed run again: its last record; failed runs left out)."""
    table: dict[str, dict[int, dict]] = {}
    for line in results.read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("label") == label and "error" not in record:
            table.setdefault(record["game"], {})[record["seed"]] = record
    return table


def report(args) -> None:
    table = load(args.results, args.label)
    if not table:
        raise SystemExit(f"no run labelled {args.label!r} in {args.results}: run `python benchmarks/minatar.py run` first")
    records = [record for seeds in table.values() for record in seeds.values()]
    machines = "; ".join(sorted({r["machine"] for r in records}))  # (seeds may have run on different machines)
    commits = ", ".join(sorted({r["commit"] for r in records}))
    lines = [f"`train +env=minatar env.id=MinAtar/<game>-v1 max_env_steps=<budget> seed=<s>` (label {args.label}); "
             f"{machines}; maze_cli {commits}.", "",
             "| game | env steps | every seed's last evaluation, in order | mean [95% CI] | IQM [95% CI] "
             "| mean of the last 3 evaluations | gymnax PPO | at or above |",
             "|---|---:|---|---|---|---:|---:|---|"]
    met = 0
    for game in [g for g in GAMES if g in table] + sorted(set(table) - set(GAMES)):
        runs = [table[game][seed] for seed in sorted(table[game])]
        scores = [r["score"] for r in runs]
        seeds = " / ".join(f"{s:.1f}" for s in scores)
        if len(scores) >= 3:
            mean, mid, lo, hi, (mean_lo, mean_hi) = iqm_with_interval(scores)
            stats = f"{mean:.1f} [{mean_lo:.1f}, {mean_hi:.1f}] | {mid:.1f} [{lo:.1f}, {hi:.1f}]"
        else:
            mean = statistics.fmean(scores)
            stats = f"{mean:.1f} ({len(scores)} seed{'s' if len(scores) > 1 else ''}) | -"
        reference = GYMNAX.get(game)
        above = "-" if reference is None else ("yes" if mean >= reference else "no")
        met += above == "yes"
        lines.append(f"| {game} | {statistics.median(r['env_steps'] for r in runs):,.0f} | {seeds} | {stats} "
                     f"| {statistics.fmean(r['last3'] for r in runs):.1f} | {reference if reference is not None else '-'} | {above} |")
    lines += ["", f"At or above gymnax's figure on {met} of {len(GYMNAX)} games (the bar: {BAR})."]
    publish(lines, args.out)
    if args.plot:
        plot(table, args.plot)


def plot(table: dict[str, dict[int, dict]], path: Path) -> None:
    """One panel per game: every seed's evaluation curve thin, their mean on the steps all reached, gymnax's
    figure at 10M dashed."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    games = [g for g in GAMES if g in table]
    fig, axes = plt.subplots(1, len(games), figsize=(3 * len(games), 3), squeeze=False)
    for ax, game in zip(axes[0], games):
        curves = [np.asarray(r["curve"], dtype=float) for r in table[game].values()]
        for c in curves:
            ax.plot(c[:, 0], c[:, 1], color="C0", lw=0.6, alpha=0.4)
        grid = min(curves, key=lambda c: c[-1, 0])[:, 0]
        ax.plot(grid, np.mean([np.interp(grid, c[:, 0], c[:, 1]) for c in curves], axis=0), color="C0", lw=1.8,
                label="maze_cli, mean over seeds (each seed thin)")
        if game in GYMNAX:
            ax.axhline(GYMNAX[game], color="black", ls="--", lw=1, label="gymnax PPO at 10M")
        ax.set_title(f"{game} ({len(curves)} seed{'s' * (len(curves) > 1)})", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
    finish_grid(fig, axes[0], path, ncol=2, bottom=0.16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run_p, report_p = sub.add_parser("run"), sub.add_parser("report")
    for p in (run_p, report_p):
        p.add_argument("--results", type=Path, default=RESULTS, help="the jsonl the runs append to / the report reads")
        p.add_argument("--label", default="defaults")
    run_p.add_argument("--seeds", type=int, nargs="+", required=True)
    run_p.add_argument("--games", nargs="+", default=GAMES)
    run_p.add_argument("--env-steps", type=int, default=10_000_000)
    run_p.add_argument("--override", nargs="+", action="extend", default=[], help="train overrides (a candidate setting)")
    run_p.add_argument("--runs-dir", type=Path, help="where the run dirs go (default: a new temporary folder, kept)")
    run_p.add_argument("--timeout-h", type=float, default=6.0, help="give up on one run after this many hours")
    report_p.add_argument("--out", type=Path)
    report_p.add_argument("--plot", type=Path)
    args = parser.parse_args()
    {"run": run, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
