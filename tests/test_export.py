"""`export-policy`: a trained policy as an ONNX or TorchScript file that acts as the policy does.

Checkpoints come from short real training runs, one per policy kind. Each exported model is played in a
process that imports neither torch nor maze_cli (numpy and onnxruntime only), on observations and greedy
actions the trained policy gives as `rollout` plays it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from maze_cli.errors import ConfigError
from tests.cli import REPO, run_train

EXPORT = Path(sys.executable).with_name("export-policy")
ROLLOUT = Path(sys.executable).with_name("rollout")
SHORT = ["runner=sequential", "eval.episodes=1", "epoch_length=1", "max_env_steps=1500"]
REPLAY = ["algorithm.initial_buffer_size=200", "algorithm.batch_size=32", "max_env_steps=300"]
STEPS = 40  # steps of the envs the isolated process replays

# kind -> (train overrides, classes the checkpoint may build)
KINDS: dict[str, tuple[list[str], list[str]]] = {
    "impala_mlp_discrete": (["+env=cartpole", "algorithm=impala"], []),
    "impala_lstm": (["+env=cartpole", "algorithm=impala", "policy.core=lstm", "policy.core_size=8"], []),
    "ppo_gru": (["+env=cartpole", "algorithm=ppo", "policy.core=gru", "policy.core_size=8"], []),
    "appo_dict_mask": (["+env=masked_choice", "algorithm=appo"], []),
    "ppo_info_mask": (["+env=info_mask", "algorithm=ppo"], ["tests.test_action_masks.InfoMaskChoice"]),
    "ppo_box_normalized": (["+env=pendulum", "algorithm=ppo", "+algorithm.normalize_obs=true"], []),
    "impala_cnn_uint8": (["+env=pixels", "algorithm=impala", "policy=cnn", "policy.encoder=small"], ["tests.envs.ImageEnv"]),
    "impala_cnn_bool_chw": (["+env=pixels", "algorithm=impala", "policy=cnn", "policy.encoder=small", "+env.layout=chw", "+env.dtype=bool"],
                            ["tests.envs.ImageEnv"]),
    "impala_multidiscrete_dict": (["+env=counting", "algorithm=impala", "+env.obs_kind=dict", "+env.action_kind=multidiscrete"], ["tests.envs.CountingEnv"]),
    "sac_box": (["+env=pendulum", "algorithm=sac", *REPLAY], []),
    "sac_discrete": (["+env=cartpole", "algorithm=sac", *REPLAY], []),
    "td3_box": (["+env=pendulum", "algorithm=td3", *REPLAY], []),
    "dqn": (["+env=cartpole", "algorithm=dqn", *REPLAY], []),
}
KINDS = {kind: (["policy.hidden_sizes=[16]", *overrides], allow) for kind, (overrides, allow) in KINDS.items()}


class BesselFeatures(nn.Module):
    """A user's network with an operator ONNX has no counterpart for (the Bessel function J0)."""

    def __init__(self, observation_space: gym.Space, width: int = 8):
        super().__init__()
        self.inp = nn.Linear(math.prod(observation_space.shape), width)
        self.out_dim = width

    def forward(self, observations: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.special.bessel_j0(self.inp(observations["obs"].float()))


def _config_dir(root: Path) -> Path:
    """Env and policy configs of the tests' own classes."""
    (root / "env").mkdir(parents=True, exist_ok=True)
    (root / "policy").mkdir(parents=True, exist_ok=True)
    (root / "env" / "pixels.yaml").write_text("_target_: tests.envs.ImageEnv\nsize: 10\n")
    (root / "env" / "info_mask.yaml").write_text("_target_: tests.test_action_masks.InfoMaskChoice\n")
    (root / "env" / "counting.yaml").write_text("_target_: tests.envs.CountingEnv\nlength: 7\n")
    (root / "policy" / "bessel.yaml").write_text(f"_target_: {__name__}.BesselFeatures\nwidth: 8\n")
    return root


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    """`train(name, overrides)`: the last.pt of a short real run, trained once per module."""
    root = tmp_path_factory.mktemp("export")
    config_dir = _config_dir(root / "configs")
    done: dict[str, Path] = {}

    def checkpoint(name: str, overrides: list[str]) -> Path:
        if name not in done:
            run_dir = root / name
            result = run_train("--config-dir", str(config_dir), *SHORT, *overrides, run_dir=run_dir)
            assert result.returncode == 0, result.stderr
            done[name] = run_dir / "checkpoints" / "last.pt"
        return done[name]

    return checkpoint


def export(checkpoint: Path, out: Path, fmt: str = "onnx", allow: list[str] | None = None, observations: int = 300):
    from maze_cli.export.exporter import export_checkpoint

    return export_checkpoint(checkpoint, fmt, out, observations, 0, allow or [])


def greedy_episodes(checkpoint: Path, allow: list[str], n_envs: int = 4) -> dict[str, np.ndarray]:
    """`STEPS` steps of `n_envs` envs played by the trained policy as `rollout` plays it (`act`, greedy,
    its state reset where an episode starts), as arrays: each input's raw observations `<t>:<input>`, the
    episode starts `starts` `[T, B]` and the env actions `actions` `[T, B, ...]`."""
    from maze_cli.playing import load_played
    from maze_cli.envs.spaces import ObservationWriter, action_to_env, observation_specs
    from maze_cli.export.contract import observation_inputs, raw_batch

    _, policy, env_factory = load_played(checkpoint, allow, False)
    envs = [env_factory() for _ in range(n_envs)]
    space = policy.observation_space
    inputs = observation_inputs(space, env_factory.config.get("action_mask_key") == "info")
    writer, specs = ObservationWriter(space), observation_specs(space)
    raw = [env.reset(seed=i)[0] for i, env in enumerate(envs)]
    state, starts = policy.initial_state(n_envs), torch.ones(n_envs, dtype=torch.bool)
    arrays: dict[str, np.ndarray] = {}
    all_starts, all_actions = [], []
    for t in range(STEPS):
        obs = {k: torch.zeros((n_envs, *s.shape), dtype=s.dtype) for k, s in specs.items()}
        writer.write(raw, obs)
        for name, value in raw_batch(raw, inputs, isinstance(space, gym.spaces.Dict)).items():
            arrays[f"{t}:{name}"] = value
        actions, _, state = policy.act(obs, state, starts, deterministic=True)
        env_actions = [action_to_env(env.action_space, a) for env, a in zip(envs, actions.numpy())]
        all_starts.append(starts.numpy().copy())
        all_actions.append(np.stack([np.asarray(a).reshape(-1) for a in env_actions]))
        starts = torch.zeros(n_envs, dtype=torch.bool)
        for i, (env, action) in enumerate(zip(envs, env_actions)):
            raw[i], _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                raw[i], starts[i] = env.reset()[0], True
    return {**arrays, "starts": np.stack(all_starts), "actions": np.stack(all_actions)}


# Runs with numpy and onnxruntime alone: the loop of docs/deploying.md, a recurrent state zeroed where an
# episode starts. Prints the fraction of actions that match, and the continuous actions' max difference.
ISOLATED_PLAYER = """
import sys
import numpy as np
import onnxruntime as ort

model, data = sys.argv[1], np.load(sys.argv[2])
session = ort.InferenceSession(model)
inputs = [i.name for i in session.get_inputs()]
state = None
if "state" in inputs:
    width = session.get_inputs()[inputs.index("state")].shape[1]
    state = np.zeros((data["starts"].shape[1], width), np.float32)
same, worst = [], 0.0
for t in range(data["starts"].shape[0]):
    feeds = {name: data[f"{t}:{name}"] for name in inputs if name != "state"}
    if state is not None:
        state[data["starts"][t]] = 0.0
        feeds["state"] = state
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    action = outputs["action"].reshape(len(data["starts"][t]), -1)
    if action.dtype.kind == "f":
        worst = max(worst, float(np.abs(action - data["actions"][t]).max()))
    else:
        same.append(np.all(action == data["actions"][t], axis=-1))
    if state is not None:
        state = outputs["state_out"]
assert "torch" not in sys.modules and "maze_cli" not in sys.modules, "the player imported torch or maze_cli"
print(f"{float(np.mean(same)) if same else 1.0} {worst}")
"""


def play_isolated(model: Path, data: dict[str, np.ndarray], tmp_path: Path) -> tuple[float, float]:
    """(fraction of the discrete actions that match, max difference of the continuous ones) of `model` played
    by a process without torch or maze_cli."""
    np.savez(tmp_path / "episodes.npz", **data)
    proc = subprocess.run([sys.executable, "-c", ISOLATED_PLAYER, str(model), str(tmp_path / "episodes.npz")],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    same, worst = proc.stdout.split()
    return float(same), float(worst)


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_exported_onnx_model_acts_as_the_trained_policy_in_a_process_without_torch(train, kind, tmp_path):
    overrides, allow = KINDS[kind]
    checkpoint = train(kind, overrides)
    exported = export(checkpoint, tmp_path / "policy.onnx", allow=allow)
    assert exported.parity.observations >= 300
    same, worst = play_isolated(exported.path, greedy_episodes(checkpoint, allow), tmp_path)
    assert same == 1.0
    assert worst <= 1e-5


@pytest.mark.parametrize("kind", ["impala_lstm", "impala_cnn_uint8"])
def test_a_torchscript_model_acts_as_the_trained_policy(train, kind, tmp_path):
    overrides, allow = KINDS[kind]
    checkpoint = train(kind, overrides)
    exported = export(checkpoint, tmp_path / "policy.pt", "torchscript", allow)
    data = greedy_episodes(checkpoint, allow)
    files = {"maze_cli.json": ""}
    module = torch.jit.load(str(exported.path), _extra_files=files)
    meta = json.loads(files["maze_cli.json"])
    names = [i["name"] for i in json.loads(meta["inputs"])]
    state = torch.zeros(4, int(meta["state_size"])) if "state" in names else None
    for t in range(STEPS):
        feeds = [torch.from_numpy(data[f"{t}:{n}"]) for n in names if n != "state"]
        if state is not None:
            state[torch.from_numpy(data["starts"][t])] = 0.0
            feeds.append(state)
        with torch.no_grad():
            outputs = module(*feeds)
        assert torch.equal(outputs[0].reshape(4, -1), torch.from_numpy(data["actions"][t]))
        if state is not None:
            state = outputs[-1]


def test_the_model_takes_raw_observations_in_the_envs_own_dtype_and_names(train, tmp_path):
    import onnxruntime as ort

    overrides, allow = KINDS["impala_multidiscrete_dict"]
    exported = export(train("impala_multidiscrete_dict", overrides), tmp_path / "policy.onnx", allow=allow)
    session = ort.InferenceSession(str(exported.path))
    assert [(i.name, i.type) for i in session.get_inputs()] == [("obs.count", "tensor(float)"), ("obs.parity", "tensor(int64)")]
    assert [o.name for o in session.get_outputs()] == ["action", "logits", "value"]
    action = session.run(["action"], {"obs.count": np.zeros((3, 1), np.float32), "obs.parity": np.zeros(3, np.int64)})[0]
    assert action.dtype == np.int64 and action.shape == (3, 2)
    meta = session.get_modelmeta().custom_metadata_map
    assert meta["algorithm"] == "impala" and json.loads(meta["action_space"])["type"] == "MultiDiscrete"
    import hashlib

    assert meta["checkpoint_sha256"] == hashlib.sha256(train("impala_multidiscrete_dict", overrides).read_bytes()).hexdigest()


def test_a_mask_the_env_gives_in_info_is_the_input_action_mask(train, tmp_path):
    import onnxruntime as ort

    overrides, allow = KINDS["ppo_info_mask"]
    exported = export(train("ppo_info_mask", overrides), tmp_path / "policy.onnx", allow=allow)
    session = ort.InferenceSession(str(exported.path))
    assert [(i.name, i.type) for i in session.get_inputs()] == [("action_mask", "tensor(int8)"), ("obs", "tensor(float)")]
    only = np.zeros((1, 8), np.int8)
    only[0, 3] = 1
    action, logits = session.run(["action", "logits"], {"obs": np.ones((1, 8), np.float32), "action_mask": only})
    assert action.tolist() == [3] and logits[0, 0] == -1e9


def test_a_uint8_frame_stays_uint8_and_a_box_action_stays_within_its_bounds(train, tmp_path):
    import onnxruntime as ort

    overrides, allow = KINDS["impala_cnn_uint8"]
    session = ort.InferenceSession(str(export(train("impala_cnn_uint8", overrides), tmp_path / "cnn.onnx", allow=allow).path))
    assert session.get_inputs()[0].type == "tensor(uint8)"
    overrides, _ = KINDS["ppo_box_normalized"]
    session = ort.InferenceSession(str(export(train("ppo_box_normalized", overrides), tmp_path / "box.onnx").path))
    far = np.array([[1e6, -1e6, 1e6], [-1e6, 1e6, -1e6]], np.float32)  # observations that push the mean far out
    action = session.run(["action"], {"obs": far})[0]
    assert action.dtype == np.float32 and action.shape == (2, 1)
    assert np.all(np.abs(action) <= 2.0)  # Pendulum's torque bounds


class ValueOffHead:
    """A fake head whose graph adds 1e-3 to the value: a model that differs from the trained policy."""

    def __init__(self, head):
        self.head = head
        self.policy, self.outputs = head.policy, head.outputs

    def graph(self, observations, state):
        outputs, state = self.head.graph(observations, state)
        return {**outputs, "value": outputs["value"] + 1e-3}, state

    def reference(self, observations, state):
        return self.head.reference(observations, state)


class ActionFlippedHead(ValueOffHead):
    """A fake head whose graph takes the other of CartPole's two actions."""

    def graph(self, observations, state):
        outputs, state = self.head.graph(observations, state)
        return {**outputs, "action": 1 - outputs["action"]}, state


@pytest.mark.parametrize("fake,needle", [(ValueOffHead, "output 'value' differs from the trained policy's by 0.001"),
                                         (ActionFlippedHead, "output 'action' differs from the trained policy's on 100%")])
def test_a_model_that_differs_from_the_trained_policy_is_not_written(train, tmp_path, monkeypatch, fake, needle):
    import maze_cli.export.exporter as exporter
    from maze_cli.export.heads import head_for

    monkeypatch.setattr(exporter, "head_for", lambda policy, where: fake(head_for(policy, where)))
    out = tmp_path / "out" / "policy.onnx"
    with pytest.raises(exporter.ExportMismatch) as err:
        export(train("impala_mlp_discrete", KINDS["impala_mlp_discrete"][0]), out)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []  # neither the model nor the folder made for it


def test_the_console_script_writes_the_model_and_says_how_it_was_checked(train, tmp_path):
    checkpoint = train("impala_mlp_discrete", KINDS["impala_mlp_discrete"][0])
    out = tmp_path / "policy.onnx"
    proc = subprocess.run([str(EXPORT), f"checkpoint={checkpoint}", f"out={out}", "observations=200"], capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {out} (onnx, ") and "checked against the trained policy on 2" in proc.stdout
    assert out.stat().st_size > 0


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXPORT), *args], capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": ""})


def test_a_corrupt_checkpoint_is_one_line_and_nothing_is_written(train, tmp_path):
    real = train("impala_mlp_discrete", KINDS["impala_mlp_discrete"][0]).read_bytes()
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(real[: len(real) // 2])
    proc = _cli(f"checkpoint={corrupt}", f"out={tmp_path / 'policy.onnx'}")
    assert proc.returncode == 2
    assert proc.stderr.startswith("export-policy: error: checkpoint=") and "truncated or corrupt checkpoint" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.pt"]


def test_an_operator_onnx_cannot_express_names_the_module_and_torchscript_takes_it(train, tmp_path):
    checkpoint = train("bessel", ["+env=cartpole", "policy=bessel"])
    allow = [f"{__name__}.BesselFeatures"]
    proc = _cli(f"checkpoint={checkpoint}", f"out={tmp_path / 'policy.onnx'}", f"allow=[{allow[0]}]")
    assert proc.returncode == 2
    assert "aten::special_bessel_j0" in proc.stderr and "network.module (BesselFeatures)" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""
    assert list(tmp_path.iterdir()) == []
    assert export(checkpoint, tmp_path / "policy.pt", "torchscript", allow).parity.max_difference["action"] == 0


@pytest.mark.parametrize("package", ["onnx", "onnxruntime"])
def test_a_missing_onnx_package_names_the_extra(train, tmp_path, monkeypatch, package):
    monkeypatch.setitem(sys.modules, package, None)  # what `import` finds when the package is not installed
    with pytest.raises(ConfigError, match=r"needs " + package + r", an optional extra: pip install 'maze_cli\[export\]'"):
        export(train("impala_mlp_discrete", KINDS["impala_mlp_discrete"][0]), tmp_path / "policy.onnx")
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_whose_env_class_is_not_allowed_is_refused_before_anything_runs(train, tmp_path):
    checkpoint = train("impala_multidiscrete_dict", KINDS["impala_multidiscrete_dict"][0])
    proc = _cli(f"checkpoint={checkpoint}", f"out={tmp_path / 'policy.onnx'}")
    assert proc.returncode == 2 and "'tests.envs.CountingEnv', a callable the checkpoint names; refused" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def _rollout(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROLLOUT), *args], capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": ""})


@pytest.mark.parametrize("kind", ["impala_lstm", "ppo_box_normalized", "ppo_info_mask"])
def test_rollout_of_an_exported_model_reports_what_rollout_of_its_checkpoint_does(train, kind, tmp_path):
    overrides, allow = KINDS[kind]
    checkpoint = train(kind, overrides)
    model = export(checkpoint, tmp_path / "policy.onnx", allow=allow).path
    allowed = [f"allow=[{','.join(allow)}]"] if allow else []
    of_checkpoint = _rollout(f"checkpoint={checkpoint}", "episodes=3", *allowed)
    of_model = _rollout(f"model={model}", "episodes=3", *allowed)
    assert of_model.returncode == 0, of_model.stderr
    assert of_model.stdout == of_checkpoint.stdout and "3 episodes: return" in of_model.stdout


def test_rollout_of_a_file_that_is_no_exported_model_is_one_line(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    for args, needle in (([f"model={junk}"], "not a model onnxruntime can read"), ([f"model={junk}", "checkpoint=x.pt"], "not both"),
                         ([f"model={tmp_path / 'none.onnx'}"], "no such file")):
        proc = _rollout(*args)
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_policy_group_is_one_model_per_group_checked_on_its_own_agents(train, tmp_path):
    checkpoint = train("groups", ["+env=simple_adversary", "policy.hidden_sizes=[16]"])
    with pytest.raises(ConfigError, match="export each with group=<name> \\(its groups: adversaries, good\\)"):
        export(checkpoint, tmp_path / "all.onnx")
    from maze_cli.checkpoint import load_policy

    members = load_policy(checkpoint).members
    for group in ("adversaries", "good"):
        from maze_cli.export.exporter import export_checkpoint

        exported = export_checkpoint(checkpoint, "onnx", tmp_path / f"{group}.onnx", 200, group=group)
        assert exported.parity.observations >= 200 and exported.parity.max_difference["action"] == 0
        import onnxruntime as ort

        session = ort.InferenceSession(str(exported.path))
        width = members[group].observation_space.shape[0]
        assert [(i.name, i.shape) for i in session.get_inputs()] == [("obs", ["batch", width])]
        assert session.get_modelmeta().custom_metadata_map["group"] == group
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adversaries.onnx", "good.onnx"]
    proc = _rollout(f"model={tmp_path / 'good.onnx'}")
    assert proc.returncode == 2 and "the model of policy group 'good' plays only its group's agents" in proc.stderr


def test_a_self_play_games_current_policy_exports_with_its_mask_as_an_input(train, tmp_path):
    import onnxruntime as ort

    checkpoint = train("selfplay", ["+env=connect_four", "selfplay.pool_size=2", "max_env_steps=600"])
    exported = export(checkpoint, tmp_path / "policy.onnx", observations=200)
    assert exported.parity.max_difference["action"] == 0
    names = [i.name for i in ort.InferenceSession(str(exported.path)).get_inputs()]
    assert names == ["obs.action_mask", "obs.observation"]
    of_checkpoint, of_model = _rollout(f"checkpoint={checkpoint}", "episodes=2"), _rollout(f"model={exported.path}", "episodes=2")
    assert of_model.returncode == 0, of_model.stderr
    assert of_model.stdout == of_checkpoint.stdout and "2 games against lookahead" in of_model.stdout


def test_a_recurrent_policy_shared_by_the_agents_of_a_multi_agent_env_is_checked_with_its_state(train, tmp_path):
    checkpoint = train("spread_gru", ["+env=simple_spread", "policy.hidden_sizes=[16]", "policy.core=gru", "policy.core_size=8"])
    exported = export(checkpoint, tmp_path / "policy.onnx", observations=200)
    assert exported.parity.observations >= 200
    assert exported.parity.max_difference["action"] == 0 and exported.parity.max_difference["state_out"] <= 1e-5


def test_the_check_allows_1e_5_of_an_output_above_1_and_1e_5_absolute_below():
    from maze_cli.export.parity import compare

    def verdict(expected: float, got: float):
        return compare({"value": np.array([got], np.float32)}, {"value": np.array([expected], np.float32)}, True, {})

    assert verdict(200.0, 200.0 + 1.5e-3) is None  # within 1e-5 of 200
    assert verdict(200.0, 200.01).output == "value"
    assert verdict(0.5, 0.5 + 2e-5).value == pytest.approx(2e-5, rel=0.05)
    assert verdict(0.5, float("nan")) is not None
    assert compare({"action": np.array([1, 2])}, {"action": np.array([1, 3])}, True, {}).value == 0.5
