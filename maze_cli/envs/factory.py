"""Build envs from their config: a registered gymnasium id, or any callable named by `_target_`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Mapping

import gymnasium as gym

from maze_cli.envs.action_mask import (FROM_INFO, InfoActionMask, LegalActionCheck, VectorLegalActionCheck, find_mask_key,
                                       gives_mask_in_info)
from maze_cli.envs.checks import check_spaces, keys_to_read, run_env_checker, supported_observation
from maze_cli.envs.core_inputs import PreviousActionReward, adds_inputs
from maze_cli.envs.info_stats import check_info_stats
from maze_cli.envs.keys import ID_KEYS, OWN_KEYS, env_setting
from maze_cli.envs.multiagent import AgentIdObservation, agent_spaces, as_parallel, is_multiagent, team_info_stats
from maze_cli.envs.policy_groups import PolicyGroupObservation, assign_groups
from maze_cli.envs.registration import register
from maze_cli.envs.source import EnvSource, VectorizedEnvTarget
from maze_cli.envs.spaces import TupleAsDict, action_spec, has_tuple
from maze_cli.envs.wrappers import apply_wrappers, wrapper_specs
from maze_cli.errors import ConfigError, EnvConfigError, UnsupportedSpaceError, first_line

__all__ = ["EnvFactory", "EnvConfigError", "UnsupportedSpaceError", "VectorizedEnvTarget"]


@dataclass(frozen=True)
class MultiAgentProbe:
    """What one build of a multi-agent env tells a run before its actors start."""

    agents: tuple[str, ...]
    turn_based: bool
    group_spaces: dict[str, tuple[gym.Space, gym.Space]] | None


@dataclass(frozen=True)
class EnvFactory(EnvSource):
    """A picklable factory: `EnvFactory(config)()` returns a fresh gymnasium.Env, and the `EnvSource`
    every part of a run reads its envs from.

    `config` is a plain mapping: either `{id, kwargs, max_episode_steps, ...}` for `gymnasium.make`, or
    `{_target_: "pkg.module.Callable", **arguments}` for a user's own env; besides, either kind may hold
    maze_cli's own keys (`maze_cli.envs.keys`, where each one's meaning is written).
    """

    config: Mapping[str, Any]

    def __post_init__(self) -> None:
        check_info_stats(self.config.get("info_stats"))
        wrapper_specs(self.config.get("wrappers"))
        has_id = self.config.get("id") is not None
        has_target = self.config.get("_target_") is not None
        if not (has_id or has_target):
            raise EnvConfigError("env: give env.id (a registered gymnasium id) or env._target_ (a callable returning an env)")
        if has_id and not has_target:  # with a _target_, `id` is one of the callable's arguments
            unknown = sorted(set(self.config) - set(ID_KEYS))
            if unknown:
                raise EnvConfigError(
                    f"env.{unknown[0]}: not a key of an env config with 'id' "
                    f"(allowed: {', '.join(ID_KEYS)}; put env arguments under env.kwargs)"
                )
        if has_target:
            self._check_target_arguments()

    def _check_target_arguments(self) -> None:
        """Every key of a `_target_` env config that is not maze_cli's own is an argument of the callable:
        a misspelt one is named before anything is built, with the arguments the callable takes."""
        if self.config.get("register"):
            raise EnvConfigError(f"env.register={self.config['register']}: only for an env given by env.id "
                                 f"(a _target_'s module is imported by itself)")
        from maze_cli.config.validation import check_arguments

        try:
            check_arguments("env", {k: v for k, v in self.config.items() if k not in OWN_KEYS})
        except ConfigError as err:
            raise EnvConfigError(str(err)) from None

    def __call__(self) -> gym.Env:
        env = self._build()
        if is_multiagent(env):
            env.close()
            raise EnvConfigError(f"env._target_={self.config['_target_']}: a multi-agent (PettingZoo) env, which this part of "
                                 f"maze_cli cannot step (it takes single-agent envs); use IMPALA, APPO or PPO")
        if not isinstance(env, gym.Env):
            raise EnvConfigError(f"env: {self.config.get('_target_')} returned {type(env).__name__}, not a gymnasium.Env "
                                 f"nor a PettingZoo env")
        if self.config.get("wrappers"):
            env = apply_wrappers(env, self.config["wrappers"])
        if has_tuple(env.observation_space):
            env = TupleAsDict(env)
        if self.config.get("obs_keys") is not None:
            env = self._filter_observation(env)
        if self.config.get("action_mask_key") == FROM_INFO:
            env = InfoActionMask(env)
        if adds_inputs(self.config.get("core_inputs")):
            env = PreviousActionReward(env, self.config["core_inputs"], self.reward_clip)
        mask_key = self.action_mask_key(env.observation_space, env.action_space)
        if mask_key is not None:
            env = LegalActionCheck(env, mask_key)
        return env

    def _build(self) -> Any:
        """The env as its `_target_` or id builds it, before maze_cli's wrappers."""
        if self.config.get("_target_") is not None:
            from hydra.utils import instantiate

            return instantiate({k: v for k, v in self.config.items() if k not in OWN_KEYS}, _convert_="all")
        else:
            register(self.config)
            kwargs = dict(self.config.get("kwargs") or {})
            max_steps = self.config.get("max_episode_steps")
            if max_steps is not None:
                kwargs["max_episode_steps"] = max_steps
            return gym.make(self.config["id"], **kwargs)

    def parallel_env(self) -> Any:
        """A fresh multi-agent env as a PettingZoo `ParallelEnv` (an AEC env converted): what the actors,
        evaluation and `rollout` step, every agent a row of their batch (`maze_cli.envs.multiagent`)."""
        env = self._build()
        if not is_multiagent(env):
            raise EnvConfigError(f"env._target_={self.config.get('_target_')}: not a PettingZoo env")
        return self._wrap_parallel(env)

    def training_parallel_env(self) -> Any:
        """The env the actors step: `parallel_env`, whose games (a turn-based one's, under
        `selfplay.opening_moves`) begin after random moves; evaluation's always begin at the start."""
        env = self.parallel_env()
        opening = (self.selfplay or {}).get("opening_moves", 0)
        if opening:  # with_selfplay took it for a turn-based game only: no second build here to ask
            from maze_cli.envs.turn_based import turns_of

            turns_of(env).opening_moves = opening
        return env

    def _wrap_parallel(self, env: Any) -> Any:
        """A built PettingZoo env as the run steps it: parallel, with the agent id and policy groups it asks for."""
        env = AgentIdObservation(as_parallel(env)) if self.config.get("agent_id") else as_parallel(env)
        return env if self.config.get("policy_groups") is None else PolicyGroupObservation(env, self.config["policy_groups"])

    @property
    def selfplay(self) -> Mapping[str, Any] | None:
        """The run's `selfplay` settings (set from the top-level `selfplay` keys by `with_selfplay`)."""
        return self.config.get("selfplay")

    @property
    def turn_based(self) -> bool:
        """Whether the env is a turn-based game (`maze_cli.envs.turn_based`)."""
        return self._probe is not None and self._probe.turn_based

    @property
    def policy_groups(self) -> dict[str, tuple[gym.Space, gym.Space]] | None:
        """Each group's observation and action space under `env.policy_groups`; None where the agents share
        one policy."""
        return None if self._probe is None else self._probe.group_spaces

    @property
    def agents(self) -> tuple[str, ...] | None:
        """The possible agents of a multi-agent (PettingZoo) env, None for a single-agent one."""
        return None if self._probe is None else self._probe.agents

    @cached_property
    def _probe(self) -> "MultiAgentProbe | None":
        """What a multi-agent env is (its agents, whether it is turn-based, its policy groups' spaces), from
        one env built in this process; None for a single-agent env (an env by id is a gymnasium env)."""
        if self.config.get("_target_") is None or self._builds_a_gym_env():
            self._single_agent_keys()
            return None
        env = self._built_or_config_error()
        try:
            if not is_multiagent(env):
                self._single_agent_keys()
                return None
            for key in ("wrappers", "obs_keys", "core_inputs"):
                if self.config.get(key):
                    raise EnvConfigError(f"env.{key}: not supported for a multi-agent (PettingZoo) env; wrap it with "
                                         f"PettingZoo's or SuperSuit's wrappers inside its _target_")
            from maze_cli.envs.turn_based import is_turn_based

            turn_based, parallel = is_turn_based(env), self._wrap_parallel(env)
            group_spaces = dict(parallel.group_spaces) if self.config.get("policy_groups") is not None else None
            return MultiAgentProbe(tuple(parallel.possible_agents), turn_based, group_spaces)
        finally:
            env.close()

    def _single_agent_keys(self) -> None:
        """Keys only a multi-agent env reads are one line on a single-agent one."""
        for key, value in (("agent_id", "true"), ("policy_groups", "{...}")):
            if self.config.get(key):
                raise EnvConfigError(f"env.{key}={value}: the env is not a multi-agent (PettingZoo) env; leave env.{key} out")

    def _filter_observation(self, env: gym.Env) -> gym.Env:
        """The env with only `obs_keys` of its Dict observation; a key it lacks is a config error."""
        keys = list(self.config["obs_keys"])
        space = env.observation_space
        if not isinstance(space, gym.spaces.Dict):
            env.close()
            raise EnvConfigError(f"env.obs_keys={keys}: the observation is {type(space).__name__}, not a Dict; leave env.obs_keys out")
        missing = [k for k in keys if k not in space.spaces]
        if missing or not keys:
            env.close()
            raise EnvConfigError(f"env.obs_keys: {missing[0] if missing else 'empty'}: not a key of the observation "
                                 f"(its keys: {', '.join(space.spaces)})")
        return gym.wrappers.FilterObservation(env, keys)

    @classmethod
    def for_policy(cls, env_config: Mapping[str, Any], policy_config: Mapping[str, Any] | None) -> "EnvFactory":
        """The envs a policy of `policy_config` acts in: `env_config`'s, with the inputs the policy asks
        for beyond the observation (`policy.core_inputs`)."""
        inputs = (policy_config or {}).get("core_inputs")
        if not adds_inputs(inputs):
            return cls(env_config)
        return cls({**env_config, "core_inputs": list(inputs)})

    def with_selfplay(self, selfplay: Mapping[str, Any]) -> "EnvFactory":
        """This factory carrying the run's `selfplay` settings to the actors (`maze_cli.parallel.selfplay`):
        a pool of earlier versions where `pool_size` > 0 and random openings where `opening_moves` > 0, which only
        a turn-based game takes (one line otherwise)."""
        asked = [key for key in ("pool_size", "opening_moves") if selfplay.get(key)]
        if not asked:
            return self
        if not self.turn_based:
            raise EnvConfigError(f"selfplay.{asked[0]}={selfplay[asked[0]]}: {self.describe()} is not a turn-based game "
                                 f"(a PettingZoo AEC env whose agents take turns); leave selfplay.{asked[0]} at 0")
        return type(self)({**self.config, "selfplay": dict(selfplay)})

    def _builds_a_gym_env(self) -> bool:
        """Whether the `_target_` is a gymnasium.Env class or builds vector envs too: then no env is built
        to find out whether it is a multi-agent one."""
        from hydra.utils import get_object

        try:
            target = get_object(self.config["_target_"])
        except Exception:  # noqa: BLE001 - building the env names the problem
            return False
        return (isinstance(target, type) and issubclass(target, gym.Env)) or isinstance(target, VectorizedEnvTarget)

    def _vector_target(self) -> VectorizedEnvTarget | None:
        """The `_target_` callable if it builds vector envs too."""
        if self.config.get("_target_") is None:
            return None
        from hydra.utils import get_object

        try:
            target = get_object(self.config["_target_"])
        except Exception:  # noqa: BLE001 - building the env names the problem
            return None
        return target if isinstance(target, VectorizedEnvTarget) else None

    def vector_env(self, n_envs: int) -> gym.vector.VectorEnv | None:
        """`n_envs` copies as the env's own vectorized implementation, or None where there is none,
        where `vectorize` is off, or where it is not the same env: a vector entry point that changes
        the spaces (ALE's preprocesses frames to 84x84 by default) would not match the policy. An env
        whose mask comes in `info` is built one by one (the mask is moved per env); one whose
        observations hold a mask has every step's mask checked, as one env built alone has."""
        if (not env_setting(self.config, "vectorize") or adds_inputs(self.config.get("core_inputs"))
                or self.config.get("obs_keys") is not None or self.config.get("wrappers")
                or self.config.get("action_mask_key") == FROM_INFO):
            return None
        vector = self._target_vector_env(n_envs) if self.config.get("_target_") is not None else self._id_vector_env(n_envs)
        if vector is None:
            return None
        mask_key = self.action_mask_key(vector.single_observation_space, vector.single_action_space)
        return vector if mask_key is None else VectorLegalActionCheck(vector, mask_key, self.describe())

    def _id_vector_env(self, n_envs: int) -> gym.vector.VectorEnv | None:
        """The registered id's vector entry point, where it has one that makes the same env."""
        register(self.config)
        if gym.spec(self.config["id"]).vector_entry_point is None:
            return None
        kwargs = dict(self.config.get("kwargs") or {})
        if self.config.get("max_episode_steps") is not None:
            kwargs["max_episode_steps"] = self.config["max_episode_steps"]
        vector = gym.make_vec(self.config["id"], num_envs=n_envs, vectorization_mode="vector_entry_point", **kwargs)
        single = gym.make(self.config["id"], **kwargs)
        try:
            same = ((vector.single_observation_space, vector.single_action_space) == (single.observation_space, single.action_space)
                    and not has_tuple(single.observation_space))  # the single envs' TupleAsDict then
        finally:
            single.close()
        if not same:
            vector.close()
            return None
        return vector

    def _target_vector_env(self, n_envs: int) -> gym.vector.VectorEnv | None:
        """The `_target_`'s own vector env (`VectorizedEnvTarget`); spaces other than its single env's
        are a config error, not a silent fallback: the user asked for that implementation."""
        target = self._vector_target()
        if target is None:
            return None
        arguments = {k: v for k, v in self.config.items() if k not in OWN_KEYS and not (k.startswith("_") and k.endswith("_"))}
        vector = target.vector_env(n_envs, **arguments)
        if vector is None:
            return None
        single = self()
        try:
            spaces = (single.observation_space, single.action_space)
        finally:
            single.close()
        if (vector.single_observation_space, vector.single_action_space) != spaces:
            got = (vector.single_observation_space, vector.single_action_space)
            vector.close()
            raise EnvConfigError(f"env._target_={self.config['_target_']}: its vector env's spaces {got} differ from its env's "
                                 f"{spaces}; set env.vectorize=false")
        return vector

    def without_vectorization(self) -> "EnvFactory":
        """The same env, always built one by one."""
        if self.config.get("_target_") is None or self._vector_target() is not None:
            return EnvFactory({**self.config, "vectorize": False})
        return self

    def resolved(self) -> "EnvFactory":
        """This factory, or one that fills in what a freshly built env shows, where its config leaves it
        null: the action mask moved from `info` into the observations where reset gives
        `info["action_mask"]` (`env.action_mask_key`), and a Dict observation's keys that no network reads
        (MiniGrid's text `mission`) left out (`env.obs_keys`, said in the log). A multi-agent env is left
        as it is. Called once where a run or `rollout` starts, before `check`."""
        if self.agents is not None or (self.config.get("action_mask_key") is not None and self.config.get("obs_keys") is not None):
            return self
        try:
            env = self()
        except Exception:  # noqa: BLE001 - `check` reports why the env cannot be built, in one line
            return self
        try:
            found = self.config.get("action_mask_key") is None and gives_mask_in_info(env)
        except Exception:  # noqa: BLE001 - likewise, for an env whose reset fails
            found = False
        finally:
            env.close()
        keys = None if self.config.get("obs_keys") is not None else keys_to_read(env.observation_space)
        config = {**self.config, **({"action_mask_key": FROM_INFO} if found else {}), **({"obs_keys": keys} if keys else {})}
        return type(self)(config) if config != self.config else self

    def action_mask_key(self, observation_space: gym.Space, action_space: gym.Space) -> str | None:
        """`env.action_mask_key`, checked against the spaces; null: `action_mask` where the observations have it."""
        return find_mask_key(observation_space, action_space, self.config.get("action_mask_key"))

    def describe(self) -> str:
        return str(self.config.get("id") or self.config.get("_target_"))

    @property
    def reward_clip(self) -> float | None:
        return self.config.get("reward_clip")

    @property
    def info_stats(self) -> dict[str, str]:
        """The env statistics to follow: `{info key: reduction}` (`env.info_stats`), and for a
        multi-agent env the team's and each agent's return."""
        own = check_info_stats(self.config.get("info_stats"))
        if self.agents is None:
            return own
        spec = self.config.get("policy_groups")
        groups = None if spec is None else list(dict.fromkeys(assign_groups(spec, self.agents).values()))
        return {**own, **team_info_stats(self.agents, groups)}

    def check(self) -> tuple[gym.Space, gym.Space]:
        """Build one env in this process, check its spaces are supported, and return them.

        Run before any actor starts, so a wrong env fails here with one clear message.
        """
        if self.agents is not None:
            return self._check_multiagent()
        env = self._built_or_config_error(self)
        try:
            supported_observation(env.observation_space)
            action_spec(env.action_space)
            if env_setting(self.config, "check"):
                check_spaces(env, self.describe(), self.info_stats)
                run_env_checker(env, self.describe())
            return env.observation_space, env.action_space
        finally:
            env.close()

    def _built_or_config_error(self, build: Callable[[], Any] | None = None) -> Any:
        """`build()` (the env as its config builds it, by default before maze_cli's wrappers); anything the
        env's own constructor raises is a config problem, one line naming the env."""
        try:
            return (build or self._build)()
        except EnvConfigError:
            raise
        except Exception as err:
            cause = err.__cause__ if err.__cause__ is not None and "Error in call to target" in str(err) else err
            if isinstance(cause, ConfigError):  # the env's own one-line message names the key and the fix
                raise EnvConfigError(first_line(cause)) from err
            what = f"env._target_={self.config['_target_']}" if self.config.get("_target_") else f"env.id={self.config['id']}"
            raise EnvConfigError(f"{what}: {type(cause).__name__}: {first_line(cause)}") from err

    def _check_multiagent(self) -> tuple[gym.Space, gym.Space]:
        """The space every agent shares (spaces that differ are one line), checked as a single env's."""
        env = self.parallel_env()
        try:
            observation_space, action_space = agent_spaces(env, f"env._target_={self.config['_target_']}")
            supported_observation(observation_space)
            action_spec(action_space)
            self.action_mask_key(observation_space, action_space)
            return observation_space, action_space
        finally:
            env.close()
