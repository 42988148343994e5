"""Connect Four by self-play (`+env=connect_four`): win, draw and loss rates against a random and a one-step
lookahead player within a wall-clock budget, every seed.

    python benchmarks/connect_four.py --seeds 1 2 3 --minutes 30
    python benchmarks/connect_four.py --seeds 1 --minutes 10 --overrides algorithm=ppo selfplay.pool_size=8
    python benchmarks/connect_four.py --report-only --out /tmp/table.md
    python benchmarks/connect_four.py --final-games 400 --final-for 3 /tmp/run-3/checkpoints/last.pt


`+env=connect_four` takes the settings of every turn-based game (APPO, tuning/board_game_appo.yaml); each
entry names the algorithm that ran. The rule: `max_time_s` of training (evaluations included), `eval.episodes` games against each opponent per
evaluation, half in each seat; a run's figure is its last evaluation, and its best is given beside it.
The final policy (`last.pt`) then plays `--final-games` games against each opponent with `rollout`, outside
the budget: the same figure with a tenth of the last evaluation's noise (`--final-for SEED CHECKPOINT` adds
it to the latest entry of that seed). Every run (every evaluation) is appended to
benchmarks/results/connect_four.jsonl.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from machine import commit, machine_line
from runs import publish, run_train
from scores import iqm_with_interval

RESULTS = Path(__file__).parent / "results" / "connect_four.jsonl"
OPPONENTS = ("random", "lookahead")


ROLLOUT = Path(sys.executable).with_name("rollout")


def final_games(checkpoint: Path, games: int) -> dict:
    """Win, draw and loss rates of a saved policy in `games` games against each opponent (`rollout`)."""
    out = subprocess.run([str(ROLLOUT), f"checkpoint={checkpoint}", f"episodes={games}"], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, check=False)
    if out.returncode != 0:
        raise SystemExit(f"rollout {checkpoint} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    found = re.findall(r"games against (\w+): win ([\d.]+), draw ([\d.]+), loss ([\d.]+)", out.stdout)
    return {"games": games} | {f"{rate}/{o}": float(x) for o, *rates in found for rate, x in zip(("win", "draw", "loss"), rates)}


def one_run(seed: int, minutes: float, overrides: list[str], workdir: Path, games: int) -> dict:
    run = run_train(["+env=connect_four", f"seed={seed}", f"max_time_s={minutes * 60:.0f}", *overrides],
                    workdir / f"run-{seed}", timeout_s=minutes * 60 + 900)
    evaluations = [{"env_steps": r["env_steps"], "time_s": r["time_s"],
                    **{f"{rate}/{o}": r[f"eval/{rate}_rate/{o}"] for o in OPPONENTS for rate in ("win", "draw", "loss")}}
                   for r in run.rows if f"eval/win_rate/{OPPONENTS[0]}" in r]
    config = yaml.safe_load((run.run_dir / "config.yaml").read_text())
    algorithm = config["algorithm"]["_target_"].rsplit(".", 1)[-1].lower()
    policy = config["policy"]["_target_"].rsplit(".", 1)[-1].removesuffix("Network").lower()
    return {"seed": seed, "minutes": minutes, "algorithm": algorithm, "policy": policy, "opening_moves": config["selfplay"].get("opening_moves", 0),
            "overrides": overrides, "evaluations": evaluations,
            "final": final_games(run.run_dir / "checkpoints" / "last.pt", games) if games else None,
            "wall_s": round(run.wall_s, 1), "machine": machine_line(), "commit": commit()}


def report(entries: list[dict]) -> list[str]:
    lines = ["| settings | minutes | opponent | win rate, last evaluation, seeds in order | mean [95% CI] | IQM [95% CI] | best win rate | draws / losses (last) | final policy: win, draw, loss |",
             "|---|---:|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, float], list[dict]] = {}
    for entry in entries:
        openings = f" opening_moves={entry['opening_moves']}" if entry.get("opening_moves") else ""
        policy = f" policy={entry['policy']}" if entry.get("policy") else ""
        code = f" (at {entry['commit']})" if entry.get("commit") else ""
        settings = f"{entry['algorithm']}{policy}{openings} {' '.join(entry['overrides']) or 'defaults'}{code}"
        groups.setdefault((settings, entry["minutes"]), []).append(entry)
    for (settings, minutes), runs in groups.items():
        runs.sort(key=lambda e: e["seed"])
        for o in OPPONENTS:
            last = [e["evaluations"][-1] for e in runs]
            wins = [x[f"win/{o}"] for x in last]
            if len(wins) > 1:
                mean, iqm, lo, hi, (mlo, mhi) = iqm_with_interval(wins)
                stats = f"{mean:.2f} [{mlo:.2f}, {mhi:.2f}] | {iqm:.2f} [{lo:.2f}, {hi:.2f}]"
            else:
                stats = f"{wins[0]:.2f} | -"
            best = " / ".join(f"{max(x[f'win/{o}'] for x in e['evaluations']):.2f}" for e in runs)
            other = " / ".join(f"{x[f'draw/{o}']:.2f}, {x[f'loss/{o}']:.2f}" for x in last)
            every = " / ".join(f"s{e['seed']}: {w:.2f}" for e, w in zip(runs, wins))
            final = " / ".join(f"{f['win/' + o]:.3f}, {f['draw/' + o]:.3f}, {f['loss/' + o]:.3f} ({f['games']} games)"
                               if (f := e.get("final")) else "-" for e in runs)
            lines.append(f"| {settings} | {minutes:g} | {o} | {every} | {stats} | {best} | {other} | {final} |")
    return lines


def add_final(seed: int, checkpoint: Path, games: int) -> None:
    """The final games of a run's checkpoint, written into the latest entry of `seed`."""
    entries = [json.loads(line) for line in RESULTS.read_text().splitlines()]
    latest = max(i for i, e in enumerate(entries) if e["seed"] == seed)
    entries[latest]["final"] = final_games(checkpoint, games)
    RESULTS.write_text("".join(json.dumps(e) + "\n" for e in entries))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--overrides", nargs="*", default=[], help="more train overrides, e.g. algorithm=ppo")
    parser.add_argument("--out", type=Path, help="also write the Markdown report here")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--final-games", type=int, default=400, help="games per opponent of the final policy (0: none)")
    parser.add_argument("--final-for", nargs=2, metavar=("SEED", "CHECKPOINT"),
                        help="only play the final games of CHECKPOINT, into the latest entry of SEED")
    args = parser.parse_args()
    if args.final_for:
        add_final(int(args.final_for[0]), Path(args.final_for[1]), args.final_games)
    elif not args.report_only:
        with tempfile.TemporaryDirectory() as tmp:
            for seed in args.seeds:
                entry = one_run(seed, args.minutes, args.overrides, Path(tmp), args.final_games)
                RESULTS.parent.mkdir(exist_ok=True)
                with RESULTS.open("a") as f:
                    f.write(json.dumps(entry) + "\n")
                print(json.dumps({k: v for k, v in entry.items() if k != "evaluations"} | {"last": entry["evaluations"][-1]}), flush=True)
    entries = [json.loads(line) for line in RESULTS.read_text().splitlines()]
    publish([f"Machine: {entries[-1]['machine']}", ""] + report(entries), args.out)


if __name__ == "__main__":
    main()
