"""The keys of an env config that maze_cli reads, each with its default and its help: the one place the
factory, the error messages and the configuration reference take them from.

Every one is set as `env.<key>=<value>` on any env config, packaged or the user's own, whether or not
its file has the key (`train` passes env keys to Hydra as `++env.<key>`). Every other key of a
`_target_` env config is an argument of that callable; of an `id` config, there is none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["id", "any", "multiagent", "internal"]


@dataclass(frozen=True)
class EnvKey:
    default: Any
    help: str
    kind: Kind = "any"  # id: with `env.id` only; multiagent: a PettingZoo `_target_`; internal: set by maze_cli


ENV_KEYS: dict[str, EnvKey] = {
    "id": EnvKey(None, "a registered gymnasium id (or give `_target_`, a callable that returns the env)", "id"),
    "kwargs": EnvKey({}, "the env's arguments: `gymnasium.make(id, **kwargs)`", "id"),
    "max_episode_steps": EnvKey(None, "the env's time limit; null: the one it is registered with", "id"),
    "register": EnvKey(None, "a module imported first (its `register_envs()` called, if it has one), for ids that "
                             "exist only once it ran, e.g. `minatar.gym`", "id"),
    "vectorize": EnvKey(True, "step the env's own vectorized implementation where it has one (gymnasium's "
                              "`vector_entry_point`, or a `_target_` with `vector_env`)"),
    "check": EnvKey(True, "run the env checks before any actor starts: spaces kept on reset and a few steps, "
                          "gymnasium's env checker as warnings"),
    "info_stats": EnvKey(None, "env statistics: `{info key: last, sum, mean, max or min}`, logged as `env/<key>`"),
    "wrappers": EnvKey([], "wrappers applied in order to every env: dotted names, or `{_target_: ..., <argument>: ...}`"),
    "reward_clip": EnvKey(None, "the learner's rewards clipped to `[-reward_clip, reward_clip]`; the stats keep the env's own"),
    "obs_keys": EnvKey(None, "the keys of a Dict observation the policy sees, the others left out"),
    "action_mask_key": EnvKey(None, "the observation key of the action mask; null: `action_mask` where the observations "
                                    "or the reset's info have it; `info`: from `info[\"action_mask\"]`; false: no mask"),
    "agent_id": EnvKey(False, "each agent's index, one-hot, in its observation under the key `agent_id`", "multiagent"),
    "policy_groups": EnvKey(None, "`{group: [agent names or patterns]}`: one policy per group", "multiagent"),
    "core_inputs": EnvKey(None, "the previous action and reward as observation keys: from `policy.core_inputs`", "internal"),
    "selfplay": EnvKey(None, "the run's `selfplay` settings, carried to the actors", "internal"),
}

# The keys an `id` config may hold (multi-agent ones are refused there with their own message).
ID_KEYS = tuple(key for key, spec in ENV_KEYS.items() if spec.kind != "internal" or key == "core_inputs")
# maze_cli's keys, never passed to a `_target_` as arguments.
OWN_KEYS = tuple(key for key, spec in ENV_KEYS.items() if spec.kind != "id") + ("register",)


def env_setting(config: Any, key: str) -> Any:
    """`config[key]`, or the key's default where the config leaves it out."""
    return config[key] if key in config else ENV_KEYS[key].default
