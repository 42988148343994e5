"""JSON-able space descriptions: exact round trips, strict JSON, and a clear refusal of other spaces."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from maze_cli.envs import EnvFactory
from maze_cli.envs.spaces import ObservationWriter, observation_specs, space_from_dict, space_to_dict
from maze_cli.errors import UnsupportedSpaceError

INF = np.inf

SPACES = {
    "box_float32": gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32),
    "box_fractional_bounds": gym.spaces.Box(
        low=np.array([0.1, -2.5, 1e-7], dtype=np.float32), high=np.array([0.3, 2.5, 3.3], dtype=np.float32)
    ),
    "box_mixed_infinite": gym.spaces.Box(
        low=np.array([[-INF, 0.0], [-1.5, -INF]]), high=np.array([[INF, 1.0], [INF, 2.0]]), dtype=np.float64
    ),
    "box_unbounded": gym.spaces.Box(-INF, INF, shape=(2, 2), dtype=np.float32),
    "box_uint8_image": gym.spaces.Box(0, 255, shape=(8, 6, 3), dtype=np.uint8),
    "box_int_with_infinite": gym.spaces.Box(low=np.array([-INF, 0.0]), high=np.array([5.0, INF]), dtype=np.int32),
    "box_int64_low_infinite": gym.spaces.Box(low=np.array([-INF, 0.0]), high=np.array([5.0, 7.0]), dtype=np.int64),
    "box_scalar": gym.spaces.Box(0.0, 1.0, shape=(), dtype=np.float32),
    "box_bool": gym.spaces.Box(0, 1, shape=(2,), dtype=np.bool_),
    "discrete": gym.spaces.Discrete(5),
    "discrete_start": gym.spaces.Discrete(3, start=-1),
    "discrete_int32": gym.spaces.Discrete(4, dtype=np.int32),
    "multi_discrete": gym.spaces.MultiDiscrete([3, 2, 4]),
    "multi_discrete_start": gym.spaces.MultiDiscrete([3, 2], start=[1, -5]),
    "multi_discrete_2d": gym.spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]), dtype=np.int32),
    "multi_binary": gym.spaces.MultiBinary(4),
    "multi_binary_2d": gym.spaces.MultiBinary([2, 3]),
    "tuple": gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(-INF, 0.0, shape=(1,)))),
    "nested_dict": gym.spaces.Dict(
        [
            ("zeta", gym.spaces.Box(0, 255, shape=(4, 4, 1), dtype=np.uint8)),
            (
                "alpha",
                gym.spaces.Dict(
                    [("pos", gym.spaces.Box(-INF, INF, shape=(2,))), ("goal", gym.spaces.Discrete(5, start=1))]
                ),
            ),
            ("mid", gym.spaces.MultiBinary(3)),
        ]
    ),
}


def plain_types_only(value, path="$"):
    """Fail on anything but list / dict / str / int / float / bool (exact types: np.float64 subclasses float)."""
    if type(value) is dict:
        for key, sub in value.items():
            assert type(key) is str, f"{path}: key {key!r} is a {type(key).__name__}"
            plain_types_only(sub, f"{path}.{key}")
    elif type(value) is list:
        for i, sub in enumerate(value):
            plain_types_only(sub, f"{path}[{i}]")
    else:
        assert type(value) in (str, int, float, bool), f"{path}: {value!r} is a {type(value).__name__}"


def assert_same_space(a, b):
    """Stricter than gymnasium's ==: Box bounds exact (not allclose), bounded flags and Dict key order equal."""
    assert type(a) is type(b) and a == b
    if isinstance(a, gym.spaces.Box):
        assert a.dtype == b.dtype
        assert np.array_equal(a.low, b.low) and np.array_equal(a.high, b.high)
        assert np.array_equal(a.bounded_below, b.bounded_below) and np.array_equal(a.bounded_above, b.bounded_above)
    elif isinstance(a, gym.spaces.Dict):
        assert list(a.spaces) == list(b.spaces)
        for key in a.spaces:
            assert_same_space(a[key], b[key])
    elif isinstance(a, gym.spaces.Tuple):
        for sub_a, sub_b in zip(a.spaces, b.spaces):
            assert_same_space(sub_a, sub_b)


@pytest.mark.parametrize("name", SPACES)
def test_round_trip_gives_an_equal_space(name):
    space = SPACES[name]
    description = space_to_dict(space)
    restored = space_from_dict(description)
    assert_same_space(restored, space)
    assert space_to_dict(restored) == description


@pytest.mark.parametrize("name", SPACES)
def test_round_trip_through_strict_json(name):
    space = SPACES[name]
    description = space_to_dict(space)
    plain_types_only(description)
    text = json.dumps(description, allow_nan=False)
    assert_same_space(space_from_dict(json.loads(text)), space)


def test_box_description_is_readable():
    space = SPACES["box_mixed_infinite"]
    assert space_to_dict(space) == {
        "type": "Box",
        "shape": [2, 2],
        "dtype": "float64",
        "low": [["-inf", 0.0], [-1.5, "-inf"]],
        "high": [["inf", 1.0], ["inf", 2.0]],
    }
    image = space_to_dict(SPACES["box_uint8_image"])
    assert image["dtype"] == "uint8" and image["shape"] == [8, 6, 3]
    assert np.array(image["low"]).shape == (8, 6, 3) and image["high"][0][0] == [255, 255, 255]


def test_signed_int_box_keeps_its_infinite_bounds():
    """Box stores -inf of an int dtype as the dtype's minimum but remembers it is unbounded; so must we."""
    space = SPACES["box_int_with_infinite"]
    description = space_to_dict(space)
    assert description["low"] == ["-inf", 0] and description["high"] == [5, "inf"]
    restored = space_from_dict(description)
    assert restored.low[0] == np.iinfo(np.int32).min and not restored.bounded_below[0]
    assert not restored.is_bounded("both")


def test_dict_keeps_key_order_not_sorted():
    space = SPACES["nested_dict"]
    description = space_to_dict(space)
    assert list(description["spaces"]) == ["zeta", "alpha", "mid"]
    assert list(description["spaces"]["alpha"]["spaces"]) == ["pos", "goal"]
    restored = space_from_dict(json.loads(json.dumps(description)))
    assert list(restored.spaces) == ["zeta", "alpha", "mid"]
    assert list(restored["alpha"].spaces) == ["pos", "goal"]


def test_descriptions_of_different_spaces_differ():
    """A description that drops a field (start, dtype) would make different spaces look the same."""
    pairs = [
        (gym.spaces.Discrete(3), gym.spaces.Discrete(3, start=1)),
        (gym.spaces.Discrete(3), gym.spaces.Discrete(3, dtype=np.int32)),
        (gym.spaces.MultiDiscrete([2, 2]), gym.spaces.MultiDiscrete([2, 2], start=[0, 1])),
        (gym.spaces.Box(0, 1, (2,), np.float32), gym.spaces.Box(0, 1, (2,), np.float64)),
        (gym.spaces.Box(0, 1, (2,), np.float32), gym.spaces.Box(0, 1, (1, 2), np.float32)),
    ]
    for a, b in pairs:
        assert space_to_dict(a) != space_to_dict(b)
        assert space_from_dict(space_to_dict(a)) != b


@pytest.mark.parametrize(
    "space, type_name",
    [
        (gym.spaces.Text(max_length=8), "Text"),
        (gym.spaces.Sequence(gym.spaces.Discrete(2)), "Sequence"),
        (gym.spaces.Graph(node_space=gym.spaces.Discrete(2), edge_space=None), "Graph"),
    ],
)
def test_unsupported_space_is_refused_by_name(space, type_name):
    with pytest.raises(UnsupportedSpaceError, match=type_name):
        space_to_dict(space)


def test_unsupported_space_inside_a_dict_names_its_key():
    space = gym.spaces.Dict([("obs", gym.spaces.Dict([("text", gym.spaces.Text(max_length=4))]))])
    with pytest.raises(UnsupportedSpaceError, match=r"Text.*'obs/text'"):
        space_to_dict(space)


def test_unknown_description_is_refused():
    with pytest.raises(UnsupportedSpaceError, match="Text"):
        space_from_dict({"type": "Text", "max_length": 4})
    with pytest.raises(UnsupportedSpaceError, match="type"):
        space_from_dict({"n": 3})


def test_an_unsupported_observation_space_is_named_by_where_it_is():
    text = gym.spaces.Text(8)
    with pytest.raises(UnsupportedSpaceError, match="at the observation's top level is not supported"):
        observation_specs(text)
    with pytest.raises(UnsupportedSpaceError, match="at key 'goal/name' is not supported"):
        observation_specs(gym.spaces.Dict({"goal": gym.spaces.Dict({"name": text})}))


class TupleInsideEnv(gym.Env):
    """A Dict observation with a Tuple inside it, and that Tuple with another inside."""

    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32), "pair": gym.spaces.Tuple(
        (gym.spaces.Discrete(3, start=1), gym.spaces.Tuple((gym.spaces.MultiBinary(2),))))})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"pos": np.array([0.5, -0.5], np.float32), "pair": (2, (np.array([1, 0], np.int8),))}, {}

    def step(self, action):
        return self.reset()[0], 0.0, True, False, {}


def test_a_tuple_anywhere_in_an_observation_becomes_a_dict_keyed_by_position():
    env = EnvFactory({"_target_": "tests.test_space_serialization.TupleInsideEnv"})()
    assert list(observation_specs(env.observation_space)) == ["pair/0", "pair/1/0", "pos"]  # the Dict's order, the Tuples' own
    out = {key: torch.zeros((1,) + spec.shape, dtype=spec.dtype) for key, spec in observation_specs(env.observation_space).items()}
    ObservationWriter(env.observation_space).write([env.reset(seed=0)[0]], out)
    assert out["pair/0"].tolist() == [1] and out["pair/1/0"].tolist() == [[1.0, 0.0]]  # Discrete(3, start=1)'s 2 is index 1
    assert out["pos"].tolist() == [[0.5, -0.5]]
