"""Settings for turn-based games, chosen on development games (tic-tac-toe; connect-4 on a 5 x 6 board,
benchmarks/connect_n.py) before Connect Four is run: each setting trains by self-play for the same number of
seat steps, and its greedy policy plays 100 games against each fixed player (random, one-step lookahead)
every 200k seat steps (every 500k on connect_n).

    python benchmarks/selfplay_dev.py --seeds 1 --settings "algorithm=impala" "algorithm.entropy_coef=0.05"
    python benchmarks/selfplay_dev.py --game connect_n --seat-steps 3000000 --settings "" "policy=cnn"
    python benchmarks/selfplay_dev.py --report-only --out /tmp/table.md

A setting is a list of train overrides on top of `+env=board_game` with the game (so the family's
defaults apply unless it names `algorithm=...`). The figure of a run is its last evaluation; every
evaluation is appended to benchmarks/results/selfplay_dev.jsonl, with the trainer's commit that ran. The
report ends with one row per setting and commit: its seeds' mean of the last evaluation and of every
evaluation (one 10-minute seed swings by more than a setting moves it; compare settings on several).
For scale: a minimax player (random among its best moves) wins 0.87 of its games against random play
and 0.46 against the lookahead.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from machine import commit, machine_line
from runs import publish, run_train

RESULTS = Path(__file__).parent / "results" / "selfplay_dev.jsonl"
GAMES = {"tictactoe": ["+env=board_game", "env._target_=pettingzoo.classic.tictactoe_v3.env", "eval.episodes=100",
                        "eval.interval_env_steps=200000"],
         "connect_n": ["+env=board_game", "env._target_=connect_n.env", "+env.rows=5", "+env.cols=6", "+env.n=4", "eval.episodes=100",
                       "eval.interval_env_steps=500000"]}
OPPONENTS = ("random", "lookahead")


def one_run(game: str, settings: list[str], seed: int, seat_steps: int, workdir: Path) -> dict:
    run = run_train([*GAMES[game], f"max_env_steps={seat_steps}", f"seed={seed}", *settings], workdir / f"run-{seed}", timeout_s=3600,
                    pythonpath=Path(__file__).parent)
    evaluations = [{"env_steps": r["env_steps"], "time_s": r["time_s"],
                    **{f"{rate}/{o}": r[f"eval/{rate}_rate/{o}"] for o in OPPONENTS for rate in ("win", "draw", "loss")}}
                   for r in run.rows if f"eval/win_rate/{OPPONENTS[0]}" in r]
    return {"game": game, "settings": " ".join(settings) or "board_game defaults", "seed": seed, "seat_steps": seat_steps,
            "wall_s": round(run.wall_s, 1), "evaluations": evaluations, "machine": machine_line(), "commit": commit()}


def report(entries: list[dict]) -> list[str]:
    lines = ["| game | settings | seat steps | seed | random: win / draw / loss | lookahead: win / draw / loss | lookahead wins, every evaluation |",
             "|---|---|---:|---:|---|---|---|"]
    for e in entries:
        last = e["evaluations"][-1]
        rates = [" / ".join(f"{last[f'{r}/{o}']:.2f}" for r in ("win", "draw", "loss")) for o in OPPONENTS]
        every = ", ".join(f"{x['win/lookahead']:.2f}" for x in e["evaluations"])
        lines.append(f"| {e.get('game', 'tictactoe')} | {e['settings']} | {e['seat_steps']:,} | {e['seed']} | {rates[0]} | {rates[1]} | {every} |")
    return lines


def summary(entries: list[dict]) -> list[str]:
    """One row per game, setting and commit (the code's speed changes what a time budget holds): the seeds
    run, and the mean over them of the last evaluation and of every evaluation against each opponent."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for e in entries:
        groups.setdefault((e.get("game", "tictactoe"), e["settings"], e.get("commit", "-")), []).append(e)
    lines = ["| game | settings | commit | seeds | seat steps (mean) | random: last, mean of every evaluation | "
             "lookahead: last, mean of every evaluation |", "|---|---|---|---|---:|---|---|"]
    for (game, settings, code), runs in groups.items():
        cells = []
        for o in OPPONENTS:
            last = sum(r["evaluations"][-1][f"win/{o}"] for r in runs) / len(runs)
            every = sum(sum(x[f"win/{o}"] for x in r["evaluations"]) / len(r["evaluations"]) for r in runs) / len(runs)
            cells.append(f"{last:.2f}, {every:.2f}")
        steps = sum(r["evaluations"][-1]["env_steps"] for r in runs) / len(runs)
        seeds = ", ".join(str(r["seed"]) for r in runs)
        lines.append(f"| {game} | {settings} | {code} | {seeds} | {steps / 1e6:.2f}M | {cells[0]} | {cells[1]} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", choices=sorted(GAMES), default="tictactoe")
    parser.add_argument("--settings", nargs="+", default=[""], help="each a space-separated list of train overrides")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--seat-steps", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, help="also write the Markdown report here")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    if not args.report_only:
        with tempfile.TemporaryDirectory() as tmp:
            for index, settings in enumerate(args.settings):
                for seed in args.seeds:
                    entry = one_run(args.game, settings.split(), seed, args.seat_steps, Path(tmp) / str(index))
                    RESULTS.parent.mkdir(exist_ok=True)
                    with RESULTS.open("a") as f:
                        f.write(json.dumps(entry) + "\n")
                    print(report([entry])[-1], flush=True)
    entries = [json.loads(line) for line in RESULTS.read_text().splitlines()]
    publish([f"Machine: {entries[-1]['machine']}", ""] + report(entries) + ["", "Every setting, its seeds together:", ""]
            + summary(entries), args.out)


if __name__ == "__main__":
    main()
