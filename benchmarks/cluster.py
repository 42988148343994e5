"""Runs and populations on an emulated Ray cluster of several nodes, beside the same on one machine (docs/scaling.md).

    python benchmarks/cluster.py --rounds 3              # CartPole, 1M env steps a run (a member)
    python benchmarks/cluster.py --report

The cluster is `ray.cluster_utils.Cluster`: several raylets on this machine, each a node of its own with
`--cpus-per-node` CPUs, all on loopback. It shows what joining a cluster costs (placement, the object
store between nodes' processes) and that members and actors spread over the nodes; it cannot show what
more machines give, since every node shares this machine's cores. Each row is one command, run alone:

- `subproc`: `train +env=cartpole runner=subproc` (subprocess actors on this machine);
- `ray local`: `runner=ray` with a Ray that `train` starts on this machine;
- `ray cluster`: `runner=ray runner.address=<the cluster>`;
- `population subproc` and `population ray cluster`: the same with `pbt.population=2`.

Figures: env steps in all over the whole command's wall time (start-up included), and for a single run the
median of its epochs' env steps/s (steady state; a population's members pause and run at different
moments, so their epochs' rates do not add up). Median of `--rounds`. Rows go to benchmarks/results/cluster.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = Path(sys.executable).with_name("train")
RESULTS = Path(__file__).parent / "results" / "cluster.jsonl"
TASK = ["+env=cartpole", "target_return=null", "max_env_steps=1000000", "runner.n_actors=2"]
POPULATION = ["pbt.population=2", "pbt.mutations={algorithm.lr: [1e-4, 3e-3]}", "pbt.interval_env_steps=200000"]


def commands(address: str) -> dict[str, list[str]]:
    return {
        "subproc": ["runner=subproc"],
        "ray local": ["runner=ray"],
        "ray cluster": ["runner=ray", f"runner.address={address}"],
        "population subproc": ["runner=subproc", *POPULATION],
        "population ray cluster": ["runner=ray", f"runner.address={address}", *POPULATION],
    }


def measure(label: str, overrides: list[str], run_dir: Path) -> dict:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    start = time.perf_counter()
    proc = subprocess.run([str(TRAIN), *TASK, *overrides, f"hydra.run.dir={run_dir}"], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=1800)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{label} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    runs = [run_dir] if (run_dir / "stats.jsonl").is_file() else sorted(run_dir.glob("member_*"))
    steps, steady, nodes = 0, 0.0, set()
    for run in runs:
        rows = [json.loads(line) for line in (run / "stats.jsonl").read_text().splitlines() if line.strip()]
        steps += rows[-1]["env_steps"]
        steady += statistics.median(row["sps"] for row in rows[1:] or rows)
        for line in (run / "train.log").read_text().splitlines():
            if " on node " in line:
                nodes.add(line.split("(")[1].split(")")[0])
    return {"label": label, "env_steps": steps, "wall_s": wall, "env_steps_per_s": steps / wall, "steady_env_steps_per_s": steady,
            "nodes": len(nodes)}


def run(rounds: int, nodes: int, cpus_per_node: int, results: Path) -> None:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus_per_node})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=cpus_per_node)
    cluster.wait_for_nodes()
    runs_dir = Path(tempfile.mkdtemp(prefix="maze-cluster-"))
    try:
        for round_ in range(rounds):
            for label, overrides in commands(cluster.address).items():
                row = {**measure(label, overrides, runs_dir / f"{label.replace(' ', '-')}-{round_}"), "round": round_,
                       "cluster": f"{nodes} nodes x {cpus_per_node} CPUs", "cores": os.cpu_count()}
                with results.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
    finally:
        cluster.shutdown()


def report(results: Path) -> None:
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    print("| command | rounds | env steps/s, whole command (median) | steady env steps/s (median) | nodes used |")
    print("|---|---:|---:|---:|---:|")
    for label in dict.fromkeys(row["label"] for row in rows):
        mine = [row for row in rows if row["label"] == label]
        steady = "" if label.startswith("population") else f"{statistics.median(r['steady_env_steps_per_s'] for r in mine):,.0f}"
        print(f"| {label} | {len(mine)} | {statistics.median(r['env_steps_per_s'] for r in mine):,.0f} | {steady} | "
              f"{max(r['nodes'] for r in mine)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cpus-per-node", type=int, default=4)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    if args.report:
        report(args.results)
    else:
        run(args.rounds, args.nodes, args.cpus_per_node, args.results)


if __name__ == "__main__":
    main()
