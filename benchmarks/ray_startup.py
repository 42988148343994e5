"""Ray's start-up cost as maze_cli pays it: `ray.init` of a local Ray, then actors created and placed.

    python benchmarks/ray_startup.py --actors 2 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def once(n_actors: int) -> tuple[float, float, float]:
    import ray

    from maze_cli.envs import EnvFactory
    from maze_cli.parallel.ray_backend import RayDistributedActors
    from maze_cli.policies import ActorCritic

    factory = EnvFactory({"id": "CartPole-v1"})
    obs_space, act_space = factory.check()
    actors = RayDistributedActors(factory, ActorCritic(obs_space, act_space), 32, n_actors, 2, envs_per_actor=8)
    t0 = time.perf_counter()
    ray.init(address="local", include_dashboard=False, configure_logging=False)
    t1 = time.perf_counter()
    actors.start()  # creates the actors and waits for their placement
    actors.collect_outputs("cpu")
    t2 = time.perf_counter()
    actors.stop()
    ray.shutdown()
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = [once(args.actors) for _ in range(args.repeats)]
    print(f"| phase ({args.actors} actors, {os.cpu_count()} cores) | median s |")
    print("|---|---:|")
    for name, values in zip(("ray.init (local)", "actors placed + first batch", "stop + shutdown"), zip(*runs)):
        print(f"| {name} | {statistics.median(values):.2f} |")


if __name__ == "__main__":
    main()
