"""The CNN policy network: image layouts and dtypes, Dict of image + vector, bytes in shared memory,
and a pixel task learned end to end."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

from maze_cli.envs.spaces import observation_specs
from maze_cli.errors import ConfigError
from maze_cli.policies.cnn import CnnNetwork
from tests.cli import run_train
from tests.envs import ImageEnv
from tests.test_train import read_stats


@pytest.mark.parametrize("encoder,shape", [("impala", (10, 10, 4)), ("small", (10, 10, 6)), ("board", (6, 7, 2)), ("impala", (4, 84, 84)),
                                           ("nature", (4, 84, 84)), ("nature", (84, 84, 3)), ("impala", (84, 84))])
@pytest.mark.parametrize("dtype", [np.uint8, np.bool_, np.float32])
def test_conv_features_have_the_declared_width_for_every_layout_and_dtype(encoder, shape, dtype):
    space = gym.spaces.Box(0, 1 if dtype is np.bool_ else 255, shape, dtype)
    net = CnnNetwork(space, encoder=encoder, hidden_sizes=[32])
    spec = observation_specs(space)["obs"]
    x = torch.from_numpy(np.stack([space.sample() for _ in range(6)])).reshape(3, 2, *shape).to(spec.dtype)
    features, state = net({"obs": x}, (), None)
    assert features.shape == (3, 2, 32) and state == () and torch.isfinite(features).all()
    # an empty batch too (acting skips the steps with one legal action: all of a batch's may be such)
    assert net.step({"obs": x[0, :0]})[0].shape == (0, 32)


@pytest.mark.parametrize("shape,kind", [((6, 7, 2), "board"), ((3, 3, 2), "board"), ((10, 10, 4), "small"), ((4, 84, 84), "impala")])
def test_auto_keeps_a_game_board_whole_and_leaves_minatar_and_frames_to_their_nets(shape, kind):
    """A board below 8 squares a side keeps its size through the convs (each square its own features: a 3 x 3
    board would shrink to one square under MinAtar's unpadded conv); MinAtar's boards and Atari frames keep their nets."""
    net = CnnNetwork(gym.spaces.Box(0, 1, shape, np.int8), hidden_sizes=[8])
    encoder = net.encoder.images["obs"]
    expected = CnnNetwork(gym.spaces.Box(0, 1, shape, np.int8), encoder=kind, hidden_sizes=[8]).encoder.images["obs"]
    assert encoder.out_dim == expected.out_dim
    if kind == "board":
        assert encoder.out_dim == 32 * shape[0] * shape[1]


def test_hwc_and_chw_frames_of_the_same_picture_give_the_same_features():
    hwc, chw = (gym.spaces.Box(0, 255, s, np.uint8) for s in ((12, 12, 3), (3, 12, 12)))
    torch.manual_seed(0)
    a = CnnNetwork(hwc, hidden_sizes=[8])
    torch.manual_seed(0)
    b = CnnNetwork(chw, hidden_sizes=[8])
    frame = torch.randint(0, 256, (1, 12, 12, 3), dtype=torch.uint8)
    torch.testing.assert_close(a({"obs": frame.unsqueeze(0)})[0], b({"obs": frame.permute(0, 3, 1, 2).unsqueeze(0)})[0])


@pytest.mark.parametrize("shape", [(4, 20, 20), (20, 20, 3)])
def test_a_cpu_batch_convolved_in_chunks_gives_the_features_and_gradients_of_the_whole_batch(monkeypatch, shape):
    import maze_cli.policies.cnn as cnn

    space = gym.spaces.Box(0, 255, shape, np.uint8)
    torch.manual_seed(0)
    net = CnnNetwork(space, encoder="impala", hidden_sizes=[16])
    frames = torch.randint(0, 256, (5, 7, *shape), dtype=torch.uint8)

    def features_and_grads(chunk_frames: int):
        monkeypatch.setattr(cnn, "CPU_CHUNK_ELEMENTS", chunk_frames * int(np.prod(shape)))
        net.zero_grad()
        features, _ = net({"obs": frames}, (), None)
        features.pow(2).sum().backward()
        return features.detach(), [p.grad.clone() for p in net.parameters()]

    whole, whole_grads = features_and_grads(1000)
    chunked, chunked_grads = features_and_grads(3)  # 35 frames in 12 chunks, the last one short
    torch.testing.assert_close(chunked, whole)
    for a, b in zip(chunked_grads, whole_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_uint8_frames_are_scaled_inside_the_network():
    space = gym.spaces.Box(0, 255, (12, 12, 3), np.uint8)
    net = CnnNetwork(space, hidden_sizes=[8])
    frame = torch.full((1, 1, 12, 12, 3), 255, dtype=torch.uint8)
    torch.testing.assert_close(net({"obs": frame})[0], net({"obs": torch.ones(1, 1, 12, 12, 3)})[0])


def test_a_dict_of_image_and_vector_concatenates_both():
    env = ImageEnv(with_vector=True)
    net = CnnNetwork(env.observation_space, encoder="small", hidden_sizes=[])
    image_only = CnnNetwork(ImageEnv().observation_space, encoder="small", hidden_sizes=[])
    assert net.out_dim == image_only.out_dim + 2
    specs = observation_specs(env.observation_space)
    obs = {k: torch.zeros((2, 5) + s.shape, dtype=s.dtype) for k, s in specs.items()}
    assert net(obs)[0].shape == (2, 5, net.out_dim)


def test_no_image_in_the_observations_is_one_clear_error():
    with pytest.raises(ConfigError, match="no image"):
        CnnNetwork(gym.spaces.Box(-1, 1, (4,), np.float32))


def test_frames_stay_bytes_in_shared_memory():
    specs = observation_specs(ImageEnv().observation_space)
    assert specs["obs"].dtype == torch.uint8


def pixel_env_config(tmp_path, layout: str = "hwc", dtype: str = "uint8") -> str:
    config_dir = tmp_path / "configs"
    (config_dir / "env").mkdir(parents=True)
    (config_dir / "env" / "pixels.yaml").write_text(f"_target_: tests.envs.ImageEnv\nlayout: {layout}\ndtype: {dtype}\n")
    return str(config_dir)


@pytest.mark.parametrize("layout,dtype", [("hwc", "uint8"), ("chw", "bool")])
def test_a_pixel_task_is_learned_with_policy_cnn(tmp_path, layout, dtype):
    run_dir = tmp_path / "run"
    result = run_train("--config-dir", pixel_env_config(tmp_path, layout, dtype), "+env=pixels", "policy=cnn", "policy.encoder=small",
                       "policy.hidden_sizes=[32]", "runner.envs_per_actor=8", "max_env_steps=40000", "epoch_length=10",
                       "target_return=7.5", "eval.episodes=5", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    assert "MiB per rollout slot" in (run_dir / "train.log").read_text()
    assert read_stats(run_dir)[-1]["eval/return_mean"] >= 7.5  # random play scores 4 of 8


def test_frames_of_a_screen_get_the_cnn_where_the_policy_was_left_at_its_default(tmp_path):
    """policy=cnn is chosen for 32x32 frames, keeping the policy keys the run set; 12x12 images (a grid, as MiniGrid's
    view) and a run that names policy=mlp keep the MLP, told that conv encoders fit images."""
    config_dir = tmp_path / "configs"
    (config_dir / "env").mkdir(parents=True)
    (config_dir / "env" / "screen.yaml").write_text("_target_: tests.envs.ImageEnv\nsize: 32\n")
    (config_dir / "env" / "grid.yaml").write_text("_target_: tests.envs.ImageEnv\nsize: 12\n")
    short = ["--config-dir", str(config_dir), "runner=sequential", "max_env_steps=500", "epoch_length=1", "eval.episodes=1",
             "policy.hidden_sizes=[16]"]

    def policy_of(run: str, *args: str) -> tuple[dict, str]:
        result = run_train(*short, *args, run_dir=tmp_path / run)
        assert result.returncode == 0, result.stderr[-2000:]
        config = yaml.safe_load((tmp_path / run / "config.yaml").read_text())
        assert torch.load(tmp_path / run / "checkpoints" / "last.pt", weights_only=False)["config"]["policy"] == config["policy"]
        return config["policy"], result.stdout

    policy, out = policy_of("screen", "+env=screen")
    assert "policy: cnn, chosen for this env: its observations hold images of a screen, (32, 32, 3)" in out
    assert policy["_target_"] == "maze_cli.policies.cnn.CnnNetwork" and policy["hidden_sizes"] == [16]
    for run, args in (("grid", ["+env=grid"]), ("named", ["+env=screen", "policy=mlp"])):
        policy, out = policy_of(run, *args)
        assert policy["_target_"] == "maze_cli.policies.mlp.MlpNetwork", run
        assert "policy=mlp flattens them; policy=cnn is made for images" in out and "chosen for this env: its obs" not in out


def test_sac_learns_the_pixel_task_with_its_shared_encoder(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("--config-dir", pixel_env_config(tmp_path), "+env=pixels", "algorithm=sac", "runner=sequential", "policy=cnn",
                       "policy.encoder=small", "policy.hidden_sizes=[32]", "algorithm.initial_buffer_size=256", "algorithm.batch_size=64",
                       "max_env_steps=4000", "epoch_length=5", "target_return=7.5", "eval.episodes=5", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    assert read_stats(run_dir)[-1]["eval/return_mean"] >= 7.5


def test_the_minatar_config_trains_end_to_end(tmp_path):
    pytest.importorskip("minatar", reason="the optional extra minatar is not installed (pip install 'maze_cli[minatar]')")
    run_dir = tmp_path / "run"
    result = run_train("+env=minatar", "env.id=MinAtar/SpaceInvaders-v1", "max_env_steps=20000", "epoch_length=2",
                       "runner.envs_per_actor=16", "eval.episodes=2", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    log = (run_dir / "train.log").read_text()
    assert "CnnNetwork" in (run_dir / "config.yaml").read_text() and "Box(10, 10, 6) bool" in log
    assert read_stats(run_dir)[-1]["env_steps"] >= 20000


def test_a_missing_env_package_says_how_to_install_it(tmp_path):
    result = run_train("+env=gym", "env.id=Nope/Game-v1", "+env.register=no_such_pkg.gym", run_dir=tmp_path / "run")
    assert result.returncode == 2 and "env.register=no_such_pkg.gym: cannot import it" in result.stderr, result.stderr


def test_the_atari_config_trains_on_stacked_byte_frames(tmp_path):
    pytest.importorskip("ale_py", reason="the optional extra atari is not installed (pip install 'maze_cli[atari]')")
    pytest.importorskip("cv2", reason="the optional extra atari is not installed (pip install 'maze_cli[atari]')")
    run_dir = tmp_path / "run"
    result = run_train("+env=atari", "env.id=ALE/Pong-v5", "max_env_steps=512", "epoch_length=1", "runner.envs_per_actor=2",
                       "algorithm.n_rollout_steps=16", "eval.interval=0", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    log = (run_dir / "train.log").read_text()
    assert "Box(4, 84, 84) uint8" in log and "MiB per rollout slot" in log
    assert read_stats(run_dir)[-1]["env_steps"] >= 512
    algorithm = yaml.safe_load((run_dir / "config.yaml").read_text())["algorithm"]  # Atari's default: PPO, pixels normalized
    assert algorithm["_target_"] == "maze_cli.algorithms.ppo.Ppo" and algorithm["normalize_images"] is True


def test_images_with_policy_mlp_get_a_warning_naming_policy_cnn(tmp_path):
    config_dir = pixel_env_config(tmp_path)
    common = ["--config-dir", config_dir, "+env=pixels", "runner=sequential", "max_env_steps=1", "eval.interval=0"]
    mlp = run_train(*common, run_dir=tmp_path / "mlp")
    assert mlp.returncode == 0, mlp.stderr
    warnings = [line for line in mlp.stdout.splitlines() if "policy=cnn is made for images" in line]
    assert len(warnings) == 1 and "(12, 12, 3)" in warnings[0]
    cnn = run_train(*common, "policy=cnn", run_dir=tmp_path / "cnn")
    assert cnn.returncode == 0 and "policy=cnn is made for images" not in cnn.stdout


def test_the_nature_cnn_starts_with_features_that_tell_frames_apart():
    """At init the features of two frames that differ by a moving object must differ by about as much as the
    frames do: with PyTorch's default conv init the nature CNN's three layers shrank that difference 16x on
    Pong, and the policy stayed uniform for 800k agent steps."""
    torch.manual_seed(0)
    frames = torch.full((16, 4, 84, 84), 90, dtype=torch.uint8)  # a plain background, one bright square moving
    for i in range(16):
        frames[i, :, 10 + 4 * i: 16 + 4 * i, 40:46] = 236
    encoder = CnnNetwork(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), encoder="nature", hidden_sizes=[256]).encoder
    with torch.no_grad():
        features = encoder({"obs": frames})
    pixels = frames.float() / 255
    assert features.std(0).pow(2).mean().sqrt() > 0.2 * pixels.std(0).pow(2).mean().sqrt()
