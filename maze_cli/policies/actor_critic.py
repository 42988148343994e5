"""The actor-critic policy of IMPALA (and every on-policy algorithm): a network, an action head, a value head."""

from __future__ import annotations

from typing import Any, Mapping

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from maze_cli.envs.action_mask import mask_parts
from maze_cli.normalization import ObservationNormalizer
from maze_cli.policies.base import Observations, Policy, PolicyOutput, State
from maze_cli.policies.distributions import DiagGaussian, action_range, make_distribution
from maze_cli.policies.mlp import linear, mlp_network
from maze_cli.policies.network import build_network


def _actions_unscaled_in_older_checkpoints(module: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
    """A checkpoint written before the Gaussian lived in the Box's bounds has no `action_scale`: its
    policy acted with scale 1 and bias 0, and acts so again. One written before `action_log_scale`
    was kept gets it derived from its scale."""
    if prefix + "log_std" in state_dict and prefix + "action_scale" not in state_dict:
        state_dict[prefix + "action_scale"] = torch.ones_like(module.action_scale)
        state_dict[prefix + "action_bias"] = torch.zeros_like(module.action_bias)
    if prefix + "action_scale" in state_dict and prefix + "action_log_scale" not in state_dict:
        state_dict[prefix + "action_log_scale"] = state_dict[prefix + "action_scale"].log()


def shares_network(shared_network: bool | None, recurrent: bool) -> bool:
    """`shared_network` as set; None: one network for a recurrent core, one each otherwise. A memory under
    both heads learns what to keep from the value loss as well as the policy's: on a task whose answer
    comes many steps after its cue, with answers apart from the actions in between, a value network with a
    memory of its own left the policy's memory unlearned (benchmarks/ZOO.md). Sample Factory shares by default."""
    return recurrent if shared_network is None else shared_network


class ActorCritic(Policy):
    """The action distribution and the value V(s) from one network (`shared_network`) or one each.

    :param network: the config of the policy network (`_target_` and its arguments), as the
        `policy` group gives it; default: an MLP of 64 x 64 tanh units.
    :param shared_network: one network under both heads (its features must serve both), or a
        second network of the same config for the value head; None: `shares_network` decides by the core.
    :param normalize_obs: normalize the float vector keys of observations by running statistics
        that the learner updates (`maze_cli.normalization`); they are buffers of this
        module, so actors, checkpoints and `rollout` use the same ones.
    :param normalize_images: normalize image keys too, each pixel by its own running statistics.
    :param log_std_init: Box actions: the Gaussian's log std before training (a weight like the
        others, so a checkpoint's policy is rebuilt without it), in units of the action's half range.
        The Gaussian lives in the Box's bounds: the head's mean 0 is the middle of the range, and its
        mean and std are scaled by the half range (`action_scale`, `action_bias`), so an action range
        that is wide or not centred on 0 is explored as [-1, 1] is. Unbounded dims keep scale 1, bias 0.
    :param action_mask_key: the observation key of the action mask (Discrete, MultiDiscrete): forbidden
        actions get probability zero in acting, the learner's log-probs and entropy, and greedy play.
    """

    def __init__(
        self, observation_space: gym.Space, action_space: gym.Space, network: Mapping[str, Any] | None = None,
        shared_network: bool | None = False, normalize_obs: bool = False, log_std_init: float = 0.0,
        action_mask_key: str | None = None, normalize_images: bool = False,
    ):
        super().__init__()
        self.observation_space, self.action_space = observation_space, action_space
        self.action_mask_key = action_mask_key
        self.obs_normalizer = (ObservationNormalizer(observation_space, vectors=normalize_obs, images=normalize_images)
                               if normalize_obs or normalize_images else None)
        config = dict(network or mlp_network())
        self.network = build_network(config, observation_space)
        self._n_policy_state = len(self.network.initial_state(1))
        shared = shares_network(shared_network, recurrent=self._n_policy_state > 0)
        self.value_network = None if shared else build_network(config, observation_space)
        box_range = action_range(action_space) if isinstance(action_space, gym.spaces.Box) else None
        self.distribution = make_distribution(action_space, box_range)
        self.gaussian = isinstance(self.distribution, DiagGaussian)
        n_head = self.distribution.dim if self.gaussian else self.distribution.n_params
        self.policy_head = linear(self.network.out_dim, n_head, 0.01)
        self.value_head = linear((self.value_network or self.network).out_dim, 1, 1.0)
        if self.gaussian:
            self.log_std = nn.Parameter(torch.full((self.distribution.dim,), float(log_std_init)))
            scale, bias = box_range
            self.register_buffer("action_scale", scale)
            self.register_buffer("action_bias", bias)
            self.register_buffer("action_log_scale", scale.log())  # shifts the log std at every acting step
            self.register_load_state_dict_pre_hook(_actions_unscaled_in_older_checkpoints)
        self._n_choices = len(mask_parts(action_space)) if action_mask_key is not None else 0
        self._head = self.policy_head._parameters  # acting's head, without a module call (see mlp.layer_plan)

    def network_parameters(self) -> list[list[nn.Parameter]]:
        """The parameters of the action side and of the value side (value network and head), where each
        has a network of its own; one list where they share one."""
        if self.value_network is None:
            return [list(self.parameters())]
        value = [*self.value_network.parameters(), *self.value_head.parameters()]
        ids = {id(p) for p in value}
        return [[p for p in self.parameters() if id(p) not in ids], value]

    def initial_state(self, batch_size: int) -> State:
        value_state = () if self.value_network is None else self.value_network.initial_state(batch_size)
        return self.network.initial_state(batch_size) + value_state

    def _params(self, params: torch.Tensor) -> torch.Tensor:
        """The distribution's params from the policy head's output (a Gaussian's log std appended)."""
        if self.gaussian:
            mean = torch.addcmul(self.action_bias, params, self.action_scale)
            log_std = self.log_std + self.action_log_scale
            params = torch.cat([mean, log_std.expand_as(mean)], dim=-1)
        return params

    def forward(self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None,
                value_forced: bool = True) -> PolicyOutput:
        """Params `[T, B, P]` and values `[T, B]` of time-major observations. `value_forced=False` skips the
        value network too on the steps `valued_steps` leaves out (their values are 0): the learner of PPO
        and APPO, which gives such a step its value by its reward and the next step's instead."""
        k = self._n_policy_state
        raw = observations  # the mask as the env gave it, not normalized
        if self.obs_normalizer is not None:
            observations = self.obs_normalizer(observations)
        free = self._free_steps(raw, state, acting=False)
        if free is None:
            features, policy_state = self.network(observations, state[:k], episode_start)
            logits = self.policy_head(features)
        else:
            logits, policy_state = self._on_steps(free, observations, self.network, self.policy_head), ()
        if self.value_network is None:
            values, value_state = self.value_head(features).squeeze(-1), ()
        elif free is not None and not value_forced:
            values, value_state = self._on_steps(free, observations, self.value_network, self.value_head).squeeze(-1), ()
        else:
            value_features, value_state = self.value_network(observations, state[k:], episode_start)
            values = self.value_head(value_features).squeeze(-1)
        params = self._params(self.masked(logits, raw))
        return PolicyOutput(params, values, policy_state + value_state)

    def valued_steps(self, observations: Observations, state: State = ()) -> torch.Tensor | None:
        """The steps `[T, B]` (bool) whose values `forward(..., value_forced=False)` computes: those whose
        action mask leaves a choice. None where it values every step (no mask, a recurrent network, one
        network under both heads, or no step forced)."""
        if self.value_network is None:
            return None
        free = self._free_steps(observations, state, acting=False)
        if free is None:
            return None
        lead = observations[self.action_mask_key].shape[:2]
        return torch.zeros(lead.numel(), dtype=torch.bool, device=free.device).index_fill(0, free, True).reshape(lead)

    def _free_steps(self, raw: Observations, state: State, acting: bool) -> torch.Tensor | None:
        """The flat indices of the steps whose action mask leaves a choice, where the others are worth
        skipping: a step with one legal action has log-prob 0 and entropy 0 whatever the network says,
        and no gradient, yet would cost a pass of the policy network (in a turn-based game, every seat
        but the one to move passes: half the rows of actors and learner). None where nothing is skipped:
        no mask, a recurrent network (its state needs every step), or in the learner one network under
        both heads (the value needs its features on every step)."""
        if not self._n_choices or state or (self.value_network is None and not acting):
            return None
        legal = (raw[self.action_mask_key] != 0).sum(-1)
        free = (legal > self._n_choices).reshape(-1).nonzero().squeeze(1)
        return None if free.numel() == legal.numel() else free

    def _on_steps(self, free: torch.Tensor, observations: Observations, network: nn.Module, head: nn.Module) -> torch.Tensor:
        """`head(network(.))` of the learner's `[T, B]` observations on the `free` steps (flat indices) alone,
        0 elsewhere, `[T, B, out]`: for the policy head the mask, applied next, leaves those steps one
        action (log-prob 0, as the network would give)."""
        lead = next(iter(observations.values())).shape[:2]
        chosen = {key: x.reshape(-1, *x.shape[2:]).index_select(0, free).unsqueeze(0) for key, x in observations.items()}
        out = head(network(chosen)[0])[0]
        return out.new_zeros((lead.numel(), out.shape[-1])).index_copy(0, free, out).reshape(*lead, -1)

    def _acting_logits_where(self, free: torch.Tensor, observations: Observations) -> torch.Tensor:
        """Acting's logits `[B, P]` of the policy network on the `free` steps and 0 elsewhere (see `_on_steps`)."""
        chosen = {key: x.index_select(0, free) for key, x in observations.items()}
        head = self._head
        logits = F.linear(self.network.step(chosen)[0], head["weight"], head["bias"])
        batch = next(iter(observations.values())).shape[0]
        return logits.new_zeros((batch, logits.shape[-1])).index_copy(0, free, logits)

    def step_outputs(self, observations: Observations, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        """One step's params `[B, P]`, value `[B]` and next state, with no indexing that depends on the data,
        so that it traces into a graph (`export-policy`): a step with one legal action gets logits 0 before
        the mask, as acting gives it (`_acting_logits_where`), by a select instead of skipping it."""
        k = self._n_policy_state
        raw = observations
        if self.obs_normalizer is not None:
            observations = self.obs_normalizer(observations)
        features, policy_state = self.network.step(observations, state[:k], None)
        logits = self.policy_head(features)
        if self._n_choices and not state:  # as `_free_steps`: a recurrent network steps every row
            legal = (raw[self.action_mask_key] != 0).sum(-1, keepdim=True)
            logits = torch.where(legal > self._n_choices, logits, torch.zeros_like(logits))
        params = self._params(self.masked(logits, raw))
        value_features, value_state = ((features, ()) if self.value_network is None
                                       else self.value_network.step(observations, state[k:], None))
        return params, self.value_head(value_features).squeeze(-1), policy_state + value_state

    def action_params(self, observations: Observations, state: State, episode_start: torch.Tensor | None) -> tuple[torch.Tensor, State]:
        """Acting skips the value head and, with two networks, the value network: half the work; and the
        policy network on steps with one legal action. A recurrent value network still steps its state,
        so the learner can unroll it alike."""
        k = self._n_policy_state
        raw = observations
        if self.obs_normalizer is not None:
            observations = self.obs_normalizer.step(observations)
        value_state = state[k:]
        if value_state:
            _, value_state = self.value_network.step(observations, value_state, episode_start)
        free = self._free_steps(raw, state, acting=True)
        if free is not None:
            return self._params(self.masked(self._acting_logits_where(free, observations), raw)), ()
        features, policy_state = self.network.step(observations, state[:k], episode_start)
        head = self._head
        logits = self.masked(F.linear(features, head["weight"], head["bias"]), raw)
        return self._params(logits), policy_state + value_state

    @torch.no_grad()
    def value(self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None) -> torch.Tensor:
        """V(s) of time-major observations `[T, B, ...]`."""
        return self(observations, state, episode_start).values
