"""The CNN policy network (`policy=cnn`): a conv encoder for every image-shaped observation, the
other keys flattened, all concatenated, then hidden layers and the core.

An image is a Box of 3 dims (HWC or CHW: the channel axis is the smaller of the first and last,
HWC on a tie, or as `channels_last` says) or of 2 dims (one channel). uint8 pixels are scaled to
[0, 1] and bools become 0/1 inside the network, so frames travel as bytes.
"""

from __future__ import annotations

import math
from typing import Sequence

import gymnasium as gym
import torch
from torch import nn

from maze_cli.config.schema import CONV_ENCODERS
from maze_cli.errors import ConfigError
from maze_cli.envs.spaces import _flatten_spaces, image_shapes, observation_specs
from maze_cli.policies.base import Observations
from maze_cli.policies.mlp import ObservationEncoder, MlpNetwork, as_float, orthogonal_init

# Input elements of the frames a CPU convolves at once (ImageEncoder._chunk): 256 Atari observations
# (4 x 84 x 84); the chunk size is measured in benchmarks/LEARNER.md.
CPU_CHUNK_ELEMENTS = 256 * 4 * 84 * 84


class _Residual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.block = nn.Sequential(nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
                                   nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


def conv_stack(kind: str, in_channels: int) -> nn.Sequential:
    """impala: the residual net of Espeholt et al. 2018 (3 stages of 16, 32, 32 channels);
    nature: Mnih et al. 2015 (for 84 x 84 frames); small: one 3x3 conv of 16 (MinAtar's baseline); board: two
    3x3 convs of 32 padded to keep a small board's size (a 6 x 7 Connect Four board would shrink to 4 x 5 under
    `small`, and a line of pieces is the same pattern wherever it lies)."""
    if kind == "impala":
        layers: list[nn.Module] = []
        for out in (16, 32, 32):
            layers += [nn.Conv2d(in_channels, out, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1), _Residual(out), _Residual(out)]
            in_channels = out
        return nn.Sequential(*layers, nn.ReLU(), nn.Flatten())
    if kind == "nature":
        return orthogonal_convs(nn.Sequential(nn.Conv2d(in_channels, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2),
                                              nn.ReLU(), nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten()))
    if kind == "small":
        return nn.Sequential(nn.Conv2d(in_channels, 16, 3, stride=1), nn.ReLU(), nn.Flatten())
    if kind == "board":
        return nn.Sequential(nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.Flatten())
    raise ConfigError(f"policy.encoder={kind}: use one of {', '.join(CONV_ENCODERS)}")


def orthogonal_convs(stack: nn.Sequential) -> nn.Sequential:
    """The stack's convolutions with orthogonal weights of gain sqrt(2) and zero biases, as the PPO reference
    implementations start the nature CNN. PyTorch's default init shrinks each conv + ReLU layer's output by
    about sqrt(6): after the nature CNN's three, Pong's frames reach the heads as features 15x smaller than
    these, and 16x closer to one another, so the policy's logits hardly tell one frame from the next and
    stay near uniform for hundreds of thousands of steps (benchmarks/PONG.md)."""
    for layer in stack:
        if isinstance(layer, nn.Conv2d):
            orthogonal_init(layer, math.sqrt(2))
    return stack


class ImageEncoder(nn.Module):
    """One image key: to float CHW, through the conv stack, flattened."""

    def __init__(self, shape: tuple[int, ...], kind: str, channels_last: bool | None):
        super().__init__()
        if len(shape) == 2:
            self.layout, (height, width), channels = "hw", shape, 1
        else:
            last = channels_last if channels_last is not None else shape[-1] <= shape[0]
            self.layout = "hwc" if last else "chw"
            (height, width, channels) = shape if last else (shape[1], shape[2], shape[0])
        self.n_dims = len(shape)
        if kind == "auto":  # game boards keep their size; MinAtar-sized ones get MinAtar's own net; frames the IMPALA net
            kind = "board" if min(height, width) < 8 else "small" if min(height, width) < 32 else "impala"
        self.convs = conv_stack(kind, channels)
        with torch.no_grad():
            self.out_dim = int(self.convs(torch.zeros(1, channels, height, width)).shape[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[: x.dim() - self.n_dims]
        x = x.reshape(-1, *x.shape[len(lead):])
        if self.layout == "hwc":
            x = x.permute(0, 3, 1, 2)
        elif self.layout == "hw":
            x = x.unsqueeze(1)
        chunk = self._chunk(x)
        if chunk >= x.shape[0]:
            return self._convolve(x).reshape(*lead, self.out_dim)
        return torch.cat([self._convolve(part) for part in x.split(chunk)]).reshape(*lead, self.out_dim)

    def _convolve(self, x: torch.Tensor) -> torch.Tensor:
        """Frames `[N, C, H, W]` through the conv stack. Channels-last memory (what an HWC frame already
        is) makes CPU convolutions far faster than NCHW; the layout changes while the pixels are still
        bytes (a quarter of the memory traffic of floats)."""
        return self.convs(as_float(x.contiguous(memory_format=torch.channels_last)))

    @staticmethod
    def _chunk(x: torch.Tensor) -> int:
        """How many frames go through the conv stack at once. On a CPU, a learner's whole batch (thousands
        of frames) makes every activation far larger than the caches, and each layer then waits on memory:
        the stack runs chunk by chunk inside the same autograd graph (the same gradients; the backward
        pass follows the chunks too). Accelerators take the batch whole."""
        if x.device.type != "cpu":
            return x.shape[0]
        return max(1, CPU_CHUNK_ELEMENTS // max(1, x.shape[1:].numel()))


class MixedEncoder(nn.Module):
    """Images through conv encoders, every other key flattened (`ObservationEncoder`), concatenated."""

    def __init__(self, observation_space: gym.Space, kind: str, channels_last: bool | None):
        super().__init__()
        spaces = _flatten_spaces(observation_space)
        self.image_keys = list(image_shapes(observation_space))
        if not self.image_keys:
            raise ConfigError(f"policy=cnn: the observation space {observation_space} has no image (a Box of 3 dims, "
                             f"HWC or CHW, or of 2 dims); use policy=mlp")
        specs = observation_specs(observation_space)
        self.images = nn.ModuleDict({k.replace("/", "."): ImageEncoder(specs[k].shape, kind, channels_last) for k in self.image_keys})
        others = {k: s for k, s in spaces.items() if k not in self.image_keys}
        self.vectors = ObservationEncoder(gym.spaces.Dict(others)) if others else None
        self.out_dim = sum(e.out_dim for e in self.images.values()) + (self.vectors.out_dim if self.vectors else 0)

    def forward(self, observations: Observations) -> torch.Tensor:
        parts = [self.images[k.replace("/", ".")](observations[k]) for k in self.image_keys]
        if self.vectors is not None:
            parts.append(self.vectors({k: v for k, v in observations.items() if k not in self.image_keys}))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


class CnnNetwork(MlpNetwork):
    """`policy=cnn`: conv encoders for the images, then `hidden_sizes` layers and the core.

    :param encoder: auto (default: board below 8 squares a side, small below 32 pixels, else impala), impala
        (Espeholt et al. 2018), nature (Mnih et al. 2015, for 84 x 84 Atari frames), small (MinAtar's 10 x 10)
        or board (size-keeping convs for game boards such as Connect Four's 6 x 7).
    :param channels_last: force the image layout (null: guessed from the shape).
    """

    def __init__(self, observation_space: gym.Space, encoder: str = "auto", hidden_sizes: Sequence[int] = (256,),
                 activation: str = "relu", core: str = "identity", core_size: int | None = None, channels_last: bool | None = None):
        self._encoder_kind, self._channels_last = encoder, channels_last
        super().__init__(observation_space, hidden_sizes, activation, core, core_size)

    def make_encoder(self, observation_space: gym.Space, activation: str) -> nn.Module:
        return MixedEncoder(observation_space, self._encoder_kind, self._channels_last)


def share_image_encoders(source: nn.Module, target: nn.Module) -> list[nn.Parameter]:
    """Make `target` use `source`'s conv encoders (the same modules, so the same weights) where both
    are CNN networks with the same image keys; returns the shared parameters (none if not shared).

    SAC trains the conv encoder by the critic loss alone, shared with the actor (SAC-AE, DrQ): the
    actor's gradient through a conv net of its own is too noisy to learn features from."""
    mine, theirs = getattr(source, "encoder", None), getattr(target, "encoder", None)
    if not (isinstance(mine, MixedEncoder) and isinstance(theirs, MixedEncoder) and mine.image_keys == theirs.image_keys):
        return []
    theirs.images = mine.images
    return list(mine.images.parameters())
