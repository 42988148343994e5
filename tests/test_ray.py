"""runner=ray on a two-node Ray cluster emulated on this machine (127.0.0.1 only)."""

import os
import time
from functools import partial
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from maze_cli.envs import EnvFactory  # noqa: E402
from maze_cli.parallel import ActorFailure  # noqa: E402
from maze_cli.parallel.ray_backend import RayDistributedActors  # noqa: E402
from maze_cli.seeding import derive_seed  # noqa: E402
from tests.cli import REPO, fault_env, restart_budget, run_train, stopped_by  # noqa: E402
from tests.envs import StepRaisingEnv  # noqa: E402
from tests.helpers import processes_with_env_tag, wait_until  # noqa: E402
from tests.test_actors import make_policy  # noqa: E402
from tests.test_train import read_stats  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    # Ray's workers inherit this environment: keep Ray on loopback, and let them import tests.envs.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    c.add_node(num_cpus=2)
    c.wait_for_nodes()
    yield c
    c.shutdown()


# How long a stopped run's Ray actor processes may take to exit (Ray reaps them; slower under load).
ACTORS_GONE_S = 30

# Actor processes alive when the running test began: another test's, already judged by that test's own check.
_earlier_actors: set[str] = set()


def _actor_processes() -> set[str]:
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().startswith(b"ray::RayActorBody"):
                found.add(entry.name)
        except OSError:
            continue
    return found


@pytest.fixture(autouse=True)
def _actors_before_the_test():
    _earlier_actors.clear()
    _earlier_actors.update(_actor_processes())


def ray_actor_processes() -> list[str]:
    """Live processes that are (or were made into) maze_cli's Ray actors since this test began."""
    return sorted(_actor_processes() - _earlier_actors)


def describe(pids: list[str]) -> str:
    """Each process's pid, parent, state and command line: what a failed check of leftover actors shows."""
    lines = []
    for pid in pids:
        try:
            stat = (Path("/proc") / pid / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (Path("/proc") / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            lines.append(f"pid {pid} ppid {stat[1]} state {stat[0]} started at tick {stat[19]}: {cmdline[:200]}")
        except OSError:
            lines.append(f"pid {pid}: gone")
    return "; ".join(lines)


def make_actors(cluster, env_fn=None, n_actors=2, **kwargs) -> RayDistributedActors:
    env_fn = env_fn or EnvFactory({"id": "CartPole-v1"})
    return RayDistributedActors(env_fn, make_policy(env_fn()), 16, n_actors, 2, address=cluster.address, envs_per_actor=2, **kwargs)


def test_actors_land_on_both_nodes_and_are_gone_after_stop(cluster):
    with make_actors(cluster) as actors:
        assert len(actors.nodes()) == 2
        batch, *_ = actors.collect_outputs("cpu")
        assert batch.actions.shape == (16, 4)
        actors.broadcast_updated_policy(actors.policy.state_dict())
    assert not ray.is_initialized()  # the driver left; the cluster itself stays up
    assert wait_until(lambda: not ray_actor_processes(), timeout=ACTORS_GONE_S), describe(ray_actor_processes())


def test_a_killed_ray_actor_is_replaced_with_derived_seeds_and_collection_goes_on(cluster):
    with make_actors(cluster, max_restarts=2) as actors:
        actors.collect_outputs("cpu")
        killed = actors.handles[0]
        ray.kill(killed, no_restart=True)
        deadline = time.monotonic() + 30
        while actors.supervisor.restarts == 0 and time.monotonic() < deadline:  # actor 1 serves until 0 is back
            batch, *_ = actors.collect_outputs("cpu")
        assert actors.supervisor.restarts == 1 and actors.supervisor.actor_restarts == [1, 0]
        assert actors.handles[0] != killed
        assert actors.supervisor.seeds(0) != (actors.actor_env_seeds[0], actors.actor_agent_seeds[0])
        assert actors.get_stats_value("actor_restarts", name="sum") == 1
        assert batch.actions.shape == (16, 4)
        for _ in range(3):  # the replacement serves too
            actors.collect_outputs("cpu")
        assert all(ref_actor in (0, 1) for ref_actor in actors.pending.values())


def test_a_restarted_ray_actor_reports_its_derived_seeds(cluster):
    # As in the other backends (tests/test_actors.py): every env instance fails in the actor's 2nd
    # rollout; the first failure restarts the actor, the second ends the run with the seeds the
    # restarted actor ran with.
    actors = make_actors(cluster, partial(StepRaisingEnv, fail_after=20), n_actors=1, max_restarts=1,
                         actor_env_seeds=[3], actor_agent_seeds=[7])
    with pytest.raises(ActorFailure, match="all 1 restarts of runner.max_restarts used") as info, actors:
        for _ in range(20):
            actors.collect_outputs("cpu")
    assert actors.supervisor.actor_restarts == [1]
    assert (info.value.env_seed, info.value.agent_seed) == (derive_seed(3, "restart-1"), derive_seed(7, "restart-1"))
    assert "injected failure in step" in info.value.details


def test_past_max_restarts_the_run_fails_fast(cluster):
    with pytest.raises(ActorFailure, match="runner.max_restarts=0"), make_actors(cluster, max_restarts=0) as actors:
        actors.collect_outputs("cpu")
        ray.kill(actors.handles[1], no_restart=True)
        start = time.monotonic()
        try:
            for _ in range(1000):
                actors.collect_outputs("cpu")
        finally:
            assert time.monotonic() - start < 10


RAY_FAULTS = ["raise_step", "raise_reset", "sigkill", "hang"]


def ray_fault_args(cluster, tmp_path, fault) -> list[str]:
    # Ray actors take a few seconds to start on a busy machine: a longer timeout than subproc's tests.
    return [*fault_env(tmp_path, fault), "runner=ray", f"runner.address={cluster.address}", "runner.rollout_timeout_s=8"]


@pytest.mark.parametrize("fault", RAY_FAULTS)
def test_ray_with_restarts_the_run_completes_its_budget(cluster, tmp_path, fault):
    budget = restart_budget(fault, seconds=20)  # outlasts rollout_timeout_s=8
    result = run_train(*ray_fault_args(cluster, tmp_path, fault), *budget, "epoch_length=5",
                       run_dir=tmp_path / "run", timeout=180)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "fault").exists()  # the fault really happened
    log = (tmp_path / "run" / "train.log").read_text()
    assert "actor 0 failed" in log or "actor 1 failed" in log
    assert "restarting it: restart 1 of 3" in log
    assert stopped_by(budget) in log  # the budget ran out: the restart kept the run going
    # Every restart is counted once in the rows. (On a loaded machine a restarted Ray actor can take longer
    # to come up than rollout_timeout_s and be restarted again, so the count is the log's, not 1.)
    stats = read_stats(tmp_path / "run")
    restarts = [line for line in log.splitlines() if "restarting it: restart" in line]
    assert sum(row.get("actor_restarts", 0) for row in stats) == len(restarts), restarts
    assert wait_until(lambda: not ray_actor_processes(), timeout=ACTORS_GONE_S), describe(ray_actor_processes())


@pytest.mark.parametrize("fault", RAY_FAULTS)
def test_ray_without_restarts_the_run_fails_fast_with_the_error(cluster, tmp_path, fault):
    start = time.monotonic()
    result = run_train(*ray_fault_args(cluster, tmp_path, fault), "runner.max_restarts=0", "max_env_steps=10000000",
                       run_dir=tmp_path / "run", timeout=180)
    assert result.returncode == 1, result.stderr
    assert time.monotonic() - start < 45
    expected = {"raise_step": "injected failure in step", "raise_reset": "injected failure in reset",
                "sigkill": "ray actor died", "hang": "silent: no rollout"}[fault]
    assert "train: error: actor" in result.stderr and expected in result.stderr
    assert "runner.max_restarts=0" in result.stderr
    assert wait_until(lambda: not ray_actor_processes(), timeout=ACTORS_GONE_S), describe(ray_actor_processes())


def test_actors_the_cluster_cannot_place_end_the_run_saying_what_they_need(cluster, tmp_path):
    start = time.monotonic()
    result = run_train("+env=cartpole", "runner=ray", f"runner.address={cluster.address}", "runner.resources={gpu_node: 1}",
                       "runner.rollout_timeout_s=3", run_dir=tmp_path / "run", timeout=120)
    assert result.returncode == 1, result.stderr
    assert time.monotonic() - start < 45
    assert "could not place actors 0, 1 of 2" in result.stderr and "gpu_node 1" in result.stderr
    assert "CPU 4" in result.stderr  # what the cluster has
    # No actor of this run ever started, so none can be left: the run's log names none, and its own processes
    # are gone. (Counting the machine's actor processes would judge what earlier tests left, not this run.)
    assert "ray actor 0 on node" not in (tmp_path / "run" / "train.log").read_text()
    assert wait_until(lambda: processes_with_env_tag(result.tag) == [], timeout=ACTORS_GONE_S)


def test_impala_runs_end_to_end_on_the_cluster_and_survives_a_killed_actor(cluster, tmp_path):
    config_dir = tmp_path / "configs"
    (config_dir / "env").mkdir(parents=True)
    (config_dir / "env" / "fragile.yaml").write_text(
        f"_target_: tests.envs.SelfKillingEnv\nmarker: {tmp_path / 'killed'}\nkill_after: 300\nlength: 20\n"
    )
    result = run_train("--config-dir", str(config_dir), "+env=fragile", "runner=ray", f"runner.address={cluster.address}",
                       "max_env_steps=100000", "epoch_length=5", run_dir=tmp_path / "run", timeout=180)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "killed").exists()
    log = (tmp_path / "run" / "train.log").read_text()
    assert "ray actor 0 on node 127.0.0.1" in log and "restart 1 of 3" in log
    assert read_stats(tmp_path / "run")[-1]["env_steps"] >= 100000
    assert wait_until(lambda: not ray_actor_processes(), timeout=ACTORS_GONE_S), describe(ray_actor_processes())


def test_sac_runs_end_to_end_on_the_cluster(cluster, tmp_path):
    result = run_train("+env=pendulum", "algorithm=sac", "runner=ray", f"runner.address={cluster.address}",
                       "max_env_steps=1500", "epoch_length=4", "algorithm.initial_buffer_size=300", "algorithm.batch_size=64",
                       run_dir=tmp_path / "run", timeout=180)
    assert result.returncode == 0, result.stderr
    assert read_stats(tmp_path / "run")[-1]["learner/updates"] > 0
    assert wait_until(lambda: not ray_actor_processes(), timeout=ACTORS_GONE_S), describe(ray_actor_processes())


def test_apex_dqn_runs_end_to_end_on_the_cluster(cluster, tmp_path):
    result = run_train("+env=cartpole", "algorithm=dqn", "algorithm.exploration=apex", "replay_buffer=prioritized", "runner=ray",
                       f"runner.address={cluster.address}", "max_env_steps=2500", "epoch_length=4",
                       "algorithm.initial_buffer_size=300", run_dir=tmp_path / "run", timeout=180)
    assert result.returncode == 0, result.stderr
    assert read_stats(tmp_path / "run")[-1]["learner/updates"] > 0
    assert wait_until(lambda: not ray_actor_processes(), timeout=ACTORS_GONE_S), describe(ray_actor_processes())


@pytest.mark.slow
def test_a_population_places_its_members_and_their_ray_actors_over_the_clusters_nodes(cluster, tmp_path):
    """pbt.population=2 with runner=ray on the two-node cluster: each member's learner takes a CPU and
    its actor another, which fills both nodes, so members and actors run on both; the population ends
    normally, its Ray actors gone. More than the cluster holds is one line before anything starts."""
    import re

    common = ["+env=cartpole", "runner=ray", f"runner.address={cluster.address}", "pbt.population=2",
              "pbt.mutations={algorithm.lr: [1e-5, 3e-3]}", "target_return=null", "eval.episodes=3"]
    result = run_train(*common, "runner.n_actors=1", "max_env_steps=12000", "pbt.interval_env_steps=4000", "epoch_length=2",
                       run_dir=tmp_path / "pop", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    nodes = set()
    for member in (0, 1):
        log = (tmp_path / "pop" / f"member_{member}" / "train.log").read_text()
        nodes |= set(re.findall(r"(?:pbt member \d|ray actor \d) on node 127\.0\.0\.1 \((\w+)\)", log))
        assert read_stats(tmp_path / "pop" / f"member_{member}")[-1]["env_steps"] >= 12000
    assert len(nodes) == 2, nodes
    assert wait_until(lambda: not ray_actor_processes(), timeout=ACTORS_GONE_S), describe(ray_actor_processes())
    too_many = run_train(*common, "runner.n_actors=3", run_dir=tmp_path / "big", timeout=120)
    assert too_many.returncode == 2 and "needs 2 x (1 learner + 3 actors x runner.num_cpus_per_actor=1) = 8 CPUs" in too_many.stderr
    assert "the Ray cluster has 4" in too_many.stderr


def test_a_ray_started_by_maze_cli_fits_every_actor_and_is_shut_down(tmp_path):
    # Two actors that each reserve all cores: twice what this machine has, so they share them.
    cores = os.cpu_count() or 1
    result = run_train("+env=cartpole", "runner=ray", f"runner.num_cpus_per_actor={cores}", "max_env_steps=5000",
                       "epoch_length=2", run_dir=tmp_path / "run", timeout=180)
    assert result.returncode == 0, result.stderr
    log = (tmp_path / "run" / "train.log").read_text()
    assert "ray actor 0 on node" in log and "ray actor 1 on node" in log
    assert wait_until(lambda: processes_with_env_tag(result.tag) == [], timeout=15)


def test_without_ray_installed_runner_ray_says_how_to_install(monkeypatch):
    import importlib.util

    from maze_cli.cli.paths import compose_train
    from maze_cli.cli import settings as schema

    cfg = compose_train(["+env=cartpole", "runner=ray"])
    real = importlib.util.find_spec
    monkeypatch.setattr(schema.importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(schema.ConfigError, match=r"pip install 'maze_cli\[ray\]'"):
        schema.validate(cfg, [])


def test_on_policy_ray_batches_hold_only_the_current_version_and_lagging_ones_are_dropped(cluster):
    with make_actors(cluster, on_policy=True) as actors:
        for _ in range(4):
            batch, *_ = actors.collect_outputs("cpu")
            assert (batch.policy_version == actors.policy_version).all()
            assert not actors.pending  # nothing more is asked for until the next broadcast
            time.sleep(0.3)  # asynchronous actors would have collected more with this version meanwhile
            actors.broadcast_updated_policy(actors.policy.state_dict())
        stats = actors.get_epoch_stats_aggregator()
        assert stats.get("policy_lag", "max") == 0 and not stats.values("dropped_rollouts")
        assert stats.get("actor_idle_frac", "mean") > 0.3
    with make_actors(cluster, max_policy_lag=0) as actors:
        actors.collect_outputs("cpu")
        for _ in range(3):
            actors.broadcast_updated_policy(actors.policy.state_dict())
        batch, *_ = actors.collect_outputs("cpu")
        assert (batch.policy_version == actors.policy_version).all()
        assert actors.get_epoch_stats_aggregator().get("dropped_rollouts", "sum") >= 2


def test_reproducible_ray_actors_follow_the_schedule_whatever_the_arrival_order(cluster):
    from tests.test_reproducible import ENV_SEEDS, check_schedule, slow_first_actor

    with make_actors(cluster, slow_first_actor(2), n_actors=3, actor_env_seeds=ENV_SEEDS, reproducible=True) as actors:
        check_schedule(actors)
