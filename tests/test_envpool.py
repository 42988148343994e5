"""`+env=atari env.backend=envpool`: an actor's envs as one envpool, with gymnasium's observations.

The tests that step envpool skip where it is not installed (the extra `envpool`; envpool 1.2 has no
wheels for Python 3.10); the errors a user gets without it are tested everywhere.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from omegaconf import OmegaConf

from maze_cli.envs.factory import OWN_KEYS, EnvConfigError, EnvFactory
from tests.cli import REPO, run_train
from tests.test_train import read_stats

HAS_ENVPOOL = importlib.util.find_spec("envpool") is not None
HAS_ALE = importlib.util.find_spec("ale_py") is not None and importlib.util.find_spec("cv2") is not None
needs_envpool = pytest.mark.skipif(not (HAS_ENVPOOL and HAS_ALE), reason="envpool or the atari extra is not installed "
                                   "(pip install 'maze_cli[envpool]'; envpool 1.2 needs Python >= 3.11)")
# Where both backends are deterministic: no sticky actions, exactly one no-op frame after a reset
# (envpool cannot take none: it always takes 1 to noop_max).
DETERMINISTIC = {"repeat_action_probability": 0.0, "noop_max": 1}


def atari(**overrides) -> EnvFactory:
    """`+env=atari`'s env config (conf/env/atari.yaml) with `overrides`."""
    config = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "env" / "atari.yaml").env)
    return EnvFactory({**config, **overrides})


def test_envpool_not_installed_is_one_line_naming_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "envpool" else real(name, *a))
    with pytest.raises(EnvConfigError) as err:
        atari(backend="envpool").check()
    assert str(err.value) == ("env.backend=envpool: envpool is not installed; pip install 'maze_cli[envpool]' "
                              "(envpool 1.2 needs Python >= 3.11), or env.backend=gymnasium")


@pytest.mark.parametrize("overrides,message", [
    ({"backend": "pool"}, "env.backend=pool: not a backend of env=atari; use one of gymnasium, envpool"),
    ({"backend": "envpool", "id": "ALE/NoSuchGame-v5"}, "env.id=ALE/NoSuchGame-v5: not an Atari game envpool ships"),
    ({"backend": "envpool", "id": "CartPole-v1"}, "env.id=CartPole-v1: not an Atari game envpool ships"),
    ({"backend": "envpool", "noop_max": 0}, "env.noop_max=0: envpool takes 1 to noop_max no-op frames"),
    ({"backend": "envpool", "frame_stack": 1}, "env.frame_stack=1: envpool's frames keep a stack axis"),
    ({"backend": "envpool", "obs_type": "ram"}, "env.obs_type: not an option of env.backend=envpool"),
])
def test_settings_envpool_cannot_match_are_one_line_errors(overrides, message):
    if overrides["backend"] == "envpool" and not HAS_ENVPOOL:
        pytest.skip("envpool is not installed: the check stops at that")
    with pytest.raises(EnvConfigError) as err:
        atari(**overrides).check()
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@needs_envpool
def test_an_actor_gets_one_envpool_with_the_gymnasium_envs_spaces():
    from maze_cli.envs.atari_envpool import EnvpoolAtari
    from maze_cli.envs.batch import make_env_batch

    gymnasium_factory, envpool_factory = atari(), atari(backend="envpool")
    assert gymnasium_factory.vector_env(4) is None
    single = gymnasium_factory()
    vector = envpool_factory.vector_env(4)
    try:
        assert isinstance(vector, EnvpoolAtari) and vector.num_envs == 4
        assert (vector.single_observation_space, vector.single_action_space) == (single.observation_space, single.action_space)
        assert str(vector.single_observation_space) == "Box(0, 255, (4, 84, 84), uint8)"
    finally:
        vector.close()
        single.close()
    batch = make_env_batch(envpool_factory, 4)
    try:
        assert batch.next_step_autoreset
        observations = batch.reset(7)
        assert observations.shape == (4, 4, 84, 84) and observations.dtype == np.uint8
    finally:
        batch.close()
    assert make_env_batch(envpool_factory.without_vectorization(), 2).__class__.__name__ == "EnvList"  # replay workers


@needs_envpool
def test_both_backends_give_the_same_frames_rewards_and_episode_ends():
    """Pong with a fixed random action sequence, sticky actions off and exactly one no-op frame
    (`DETERMINISTIC`): the same rewards and episode lengths, and the same frames bit for bit at every
    step, except the newest frame of the step that ends a game: gymnasium's AtariPreprocessing
    max-pools it with a frame of an earlier step when the game ends within the frame skip, envpool
    keeps the last frame alone (the older three frames of that step agree). The step after an end is
    envpool's autoreset: reward 0, and the new episode's first observation, which is gymnasium's reset."""
    from maze_cli.envs.atari import make_atari, make_atari_vector

    settings = {k: v for k, v in {**atari().config, **DETERMINISTIC}.items() if k not in ("_target_", *OWN_KEYS)}
    n = 2
    singles = [make_atari(**settings) for _ in range(n)]
    pool = make_atari_vector(n, **{**settings, "backend": "envpool"})
    try:
        first = np.stack([env.reset(seed=i)[0] for i, env in enumerate(singles)])
        np.testing.assert_array_equal(pool.reset(seed=3)[0], first)
        rng = np.random.default_rng(0)
        returns, lengths = np.zeros((2, n)), np.zeros(n, dtype=int)
        ended, autoreset_next = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        while not ended.all() or autoreset_next.any():
            actions = rng.integers(0, 6, n)
            observations, rewards, terminated, truncated, _ = pool.step(actions)
            for i in np.flatnonzero(autoreset_next):
                assert rewards[i] == 0 and not (terminated[i] or truncated[i])
                np.testing.assert_array_equal(observations[i], singles[i].reset()[0])
                autoreset_next[i] = False
            for i in np.flatnonzero(~ended):
                observation, reward, term, trunc, _ = singles[i].step(int(actions[i]))
                returns[:, i] += (reward, rewards[i])
                lengths[i] += 1
                assert (term, trunc) == (terminated[i], truncated[i]), f"env {i}, step {lengths[i]}"
                ends_game = term or trunc
                np.testing.assert_array_equal(observations[i][:-1] if ends_game else observations[i],
                                              observation[:-1] if ends_game else observation)
                ended[i] = autoreset_next[i] = ends_game
        assert (returns[0] == returns[1]).all() and (returns[0] < 0).all(), returns  # Pong's scores (-21..21), not clipped
        assert lengths.min() > 500, lengths  # whole Pong games, not an early cut
    finally:
        pool.close()
        for env in singles:
            env.close()


@needs_envpool
def test_train_with_envpool_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("+env=atari", "env.backend=envpool", "max_env_steps=512", "runner.n_actors=1", "runner.envs_per_actor=4",
                       "algorithm.n_rollout_steps=16", "epoch_length=2", "eval.interval=0", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    log = (run_dir / "train.log").read_text()
    assert "env.backend=envpool: each actor steps its envs as one envpool Pong-v5" in log and "Box(4, 84, 84) uint8" in log
    assert read_stats(run_dir)[-1]["env_steps"] >= 512
