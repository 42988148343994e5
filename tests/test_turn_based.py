"""Turn-based games by self-play (`maze_cli.envs.turn_based`): seats as rows with a forced pass, and
evaluation against fixed opponents."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")

from pettingzoo.classic import connect_four_v3, tictactoe_v3  # noqa: E402

from maze_cli.envs import EnvFactory  # noqa: E402
from maze_cli.envs.multiagent import MultiAgentBatch  # noqa: E402
from maze_cli.envs.turn_based import TurnBasedParallel, lookahead_move, play_against  # noqa: E402
from maze_cli.parallel import SequentialDistributedActors  # noqa: E402
from maze_cli.policies import ActorCritic, mlp_network  # noqa: E402
from maze_cli.policies.random_policy import RandomPolicy  # noqa: E402
from tests.cli import run_train  # noqa: E402
from tests.test_checkpoints import rollout  # noqa: E402
from tests.test_multiagent import env_config, read_stats  # noqa: E402

PASS = 9  # tictactoe's 9 squares, then the pass


def test_only_the_seat_to_move_has_moves_the_others_must_pass_and_the_loser_gets_its_reward():
    game = TurnBasedParallel(tictactoe_v3.env())
    assert game.action_space("player_1").n == PASS + 1
    observations, _ = game.reset(seed=0)
    rng = np.random.default_rng(0)
    totals = {a: 0.0 for a in game.possible_agents}
    steps = 0
    while game.agents:
        movers = [a for a, o in observations.items() if not o["action_mask"][PASS]]
        assert len(movers) == 1  # one seat moves; every other may only pass
        for a, o in observations.items():
            if a != movers[0]:
                assert o["action_mask"].tolist() == [0] * PASS + [1]
        mover = movers[0]
        move = int(rng.choice(np.flatnonzero(observations[mover]["action_mask"][:PASS])))
        actions = {a: (move if a == mover else PASS) for a in game.agents}
        observations, rewards, terminated, truncated, _ = game.step(actions)
        for a, r in rewards.items():
            totals[a] += r
        steps += 1
    assert all(terminated.values()) and not any(truncated.values())
    assert sorted(totals.values()) in ([-1.0, 1.0], [0.0, 0.0])  # a win and a loss, each on its own row, or a draw
    assert 5 <= steps <= 9


def test_each_seat_is_a_row_and_an_ended_game_resets():
    factory = EnvFactory({"_target_": "pettingzoo.classic.tictactoe_v3.env"})
    assert factory.turn_based and factory.agents == ("player_1", "player_2")
    batch = MultiAgentBatch(factory.parallel_env, 4, "test")
    batch.reset(seed=1)
    policy_rng = np.random.default_rng(1)
    ended = 0
    for _ in range(60):
        actions = np.array([int(policy_rng.choice(np.flatnonzero(o["action_mask"]))) for o in batch.observations])
        step = batch.step(actions)
        assert not step.autoreset.any()  # a pass is a real step of its seat: both rows go on together
        ended += len(step.infos)
        for info in step.infos.values():
            assert info["team_return"] == 0.0  # zero-sum: one seat's win is the other's loss
    assert ended >= 10


def test_the_lookahead_takes_a_winning_move_and_blocks_the_opponents():
    env = connect_four_v3.env()
    env.reset(seed=0)
    for column in (0, 6, 0, 6, 0):  # player_0 stacks three in column 0, player_1 two in column 6
        env.step(column)
    rng = np.random.default_rng(0)
    assert lookahead_move(env, "player_1", rng) == 0  # player_1 must block column 0
    env.step(5)  # player_1 does not; player_0 to move can win in column 0
    assert all(lookahead_move(env, "player_0", np.random.default_rng(s)) == 0 for s in range(5))


@pytest.mark.parametrize("make_game", [tictactoe_v3.env, connect_four_v3.env])
def test_fixed_opponents_rank_as_they_should(make_game):
    """Against a uniformly random player the lookahead wins most games, and a random player loses most against it."""
    def make_env():
        return TurnBasedParallel(make_game())

    game = make_env()
    torch.manual_seed(0)  # the random policy samples from torch's generator
    random_policy = RandomPolicy(game.observation_space("x"), game.action_space("x"), "action_mask")
    against_random = play_against(make_env, random_policy, "random", list(range(40)), deterministic=False)
    against_lookahead = play_against(make_env, random_policy, "lookahead", list(range(40)), deterministic=False)
    assert sum(against_random[k] for k in ("win_rate", "draw_rate", "loss_rate")) == pytest.approx(1.0)
    assert 0.25 <= against_random["win_rate"] <= 0.75
    assert against_lookahead["loss_rate"] >= 0.6 and against_lookahead["win_rate"] <= 0.15  # tic-tac-toe: draws too


@pytest.mark.parametrize("groups", [None, "{first: [player_1], second: [player_2]}"])
def test_a_self_play_run_reports_win_draw_and_loss_rates_per_opponent(tmp_path, groups):
    """With one policy for both seats, or one per seat (policy groups: each plays its own seat's games)."""
    run_dir = tmp_path / "run"
    result = run_train(*env_config(tmp_path, _target_="pettingzoo.classic.tictactoe_v3.env"), "runner=sequential",
                       "runner.envs_per_actor=8", "max_env_steps=3000", "eval.episodes=4", run_dir=run_dir,
                       *([] if groups is None else [f"+env.policy_groups={groups}"]))
    assert result.returncode == 0, result.stderr
    last = read_stats(run_dir)[-1]
    for opponent in ("random", "lookahead"):
        rates = [last[f"eval/{r}_rate/{opponent}"] for r in ("win", "draw", "loss")]
        assert sum(rates) == pytest.approx(1.0)
    assert -1.0 <= last["eval/return_mean"] <= 1.0
    assert last["env/team_return"] == 0.0  # self-play: the seats' returns cancel
    # rollout plays the saved policy against the same opponents, not against itself
    out = rollout(f"checkpoint={run_dir / 'checkpoints' / 'last.pt'}", "episodes=6")
    assert out.returncode == 0, out.stderr
    lines = {m[0]: [float(x) for x in m[1:]] for m in
             re.findall(r"6 games against (\w+): win ([\d.]+), draw ([\d.]+), loss ([\d.]+)", out.stdout)}
    assert sorted(lines) == ["lookahead", "random"], out.stdout
    assert all(sum(rates) == pytest.approx(1.0, abs=2e-3) for rates in lines.values())  # three rates printed to 3 decimals


def _preferring(policy, lowest: bool, by: float = 20.0) -> dict:
    """The weights of `policy` with its head set to prefer the lowest (or highest) legal move, by far (or by
    `by` nats a square)."""
    state = {k: v.clone() for k, v in policy.state_dict().items()}
    n = state["policy_head.bias"].numel()
    state["policy_head.weight"].zero_()
    state["policy_head.bias"].copy_(torch.arange(n, dtype=torch.float32) * (-by if lowest else by))
    return state


def test_a_pool_version_plays_one_seat_of_each_game_and_those_rows_are_not_learned_from():
    """pool_share=1: once the pool holds a version, every new game gives one of its seats to it: that seat plays
    the pool's moves (the lowest legal square) and its rows are autoreset steps; the other seat plays the
    current policy's (the highest legal square) and learns."""
    factory = EnvFactory({"_target_": "pettingzoo.classic.tictactoe_v3.env"}).with_selfplay(
        {"pool_size": 2, "pool_share": 1.0, "snapshot_every": 1000})
    observation_space, action_space = factory.check()
    policy = ActorCritic(observation_space, action_space, mlp_network((8,)), action_mask_key="action_mask")
    with SequentialDistributedActors(factory, policy, 10, 1, 1, envs_per_actor=8) as actors:
        actors.broadcast_updated_policy(_preferring(policy, lowest=True))  # version 1: the pool's first snapshot
        actors.broadcast_updated_policy(_preferring(policy, lowest=False))  # version 2: the current policy
        batches = [actors.collect_outputs("cpu")[0] for _ in range(4)]
    pooled_moves = own_moves = 0
    for batch in batches[1:]:  # the games started at the reset had no pool yet; these began later
        masks = batch.observations["action_mask"][:-1]
        for t in range(batch.n_steps):
            for game in range(4):
                rows = [2 * game, 2 * game + 1]
                pooled = [r for r in rows if batch.autoreset[t, r]]
                for r in rows:
                    legal = np.flatnonzero(masks[t, r, :PASS].numpy())
                    if len(legal) == 0:
                        continue  # this seat passes
                    if r in pooled:
                        assert int(batch.actions[t, r]) == legal.min()
                        pooled_moves += 1
                    else:
                        assert int(batch.actions[t, r]) == legal.max()
                        own_moves += 1
                assert len(pooled) <= 1
    assert pooled_moves >= 10 and own_moves >= 10


def test_a_greedy_pool_plays_its_most_likely_move_where_sampling_would_not():
    """selfplay.pool_greedy: the pool's version prefers low squares only mildly (0.3 nats a square), so sampled
    its moves spread over the board; greedy, every one of them is the lowest legal square."""
    lowest_share = {}
    for greedy in (False, True):
        factory = EnvFactory({"_target_": "pettingzoo.classic.tictactoe_v3.env"}).with_selfplay(
            {"pool_size": 1, "pool_share": 1.0, "snapshot_every": 1000, "pool_greedy": greedy})
        observation_space, action_space = factory.check()
        policy = ActorCritic(observation_space, action_space, mlp_network((8,)), action_mask_key="action_mask")
        with SequentialDistributedActors(factory, policy, 10, 1, 1, envs_per_actor=8) as actors:
            actors.broadcast_updated_policy(_preferring(policy, lowest=True, by=0.3))  # the pool's version
            actors.broadcast_updated_policy(_preferring(policy, lowest=False))
            batches = [actors.collect_outputs("cpu")[0] for _ in range(4)]
        lowest = []
        for batch in batches[1:]:
            masks = batch.observations["action_mask"][:-1]
            for t, r in zip(*np.nonzero(batch.autoreset.numpy())):
                legal = np.flatnonzero(masks[t, r, :PASS].numpy())
                if len(legal) > 1:
                    lowest.append(int(batch.actions[t, r]) == legal.min())
        assert len(lowest) >= 10
        lowest_share[greedy] = float(np.mean(lowest))
    assert lowest_share[True] == 1.0 and lowest_share[False] < 0.8, lowest_share


def test_random_openings_start_training_games_off_the_empty_board_and_leave_evaluation_alone():
    """selfplay.opening_moves=4: an actor's games begin after 0 to 4 random legal moves, each count about as
    often, the same for the same seed; evaluation's games (parallel_env) begin on the empty board."""
    factory = EnvFactory({"_target_": "pettingzoo.classic.tictactoe_v3.env"}).with_selfplay({"pool_size": 0, "opening_moves": 4})

    def pieces_at_start(seed: int) -> list[int]:
        env = factory.training_parallel_env()
        counts = [int(env.reset(seed=seed)[0]["player_1"]["observation"].sum())]
        counts += [int(env.reset()[0]["player_1"]["observation"].sum()) for _ in range(249)]
        return counts

    counts = pieces_at_start(seed=5)
    assert counts == pieces_at_start(seed=5) and counts != pieces_at_start(seed=6)
    assert set(counts) == {0, 1, 2, 3, 4} and min(np.bincount(counts)) >= 30, np.bincount(counts)
    evaluation = factory.parallel_env()
    assert all(int(evaluation.reset(seed=s)[0]["player_1"]["observation"].sum()) == 0 for s in range(20))


@pytest.mark.parametrize("key", ["pool_size", "opening_moves"])
def test_a_pool_or_openings_on_a_game_that_is_not_turn_based_is_one_line(tmp_path, key):
    result = run_train("+env=cartpole", f"selfplay.{key}=4", run_dir=tmp_path / "run")
    assert result.returncode == 2
    assert result.stderr.strip() == (f"train: error: selfplay.{key}=4: CartPole-v1 is not a turn-based game (a PettingZoo "
                                     f"AEC env whose agents take turns); leave selfplay.{key} at 0")


def test_a_game_whose_observations_are_not_a_board_is_told_to_take_policy_mlp_and_then_trains(tmp_path):
    """The family's conv policy needs a board; a flat observation (a card game's) is one line naming the fix."""
    game = ["+env=board_game", "env._target_=tests.envs.flat_tictactoe", "runner=sequential", "max_env_steps=1000", "eval.episodes=2"]
    refused = run_train(*game, run_dir=tmp_path / "cnn")
    assert refused.returncode == 2
    assert refused.stderr.strip().startswith("train: error: policy=cnn: the observation space Dict(")
    assert refused.stderr.strip().endswith("has no image (a Box of 3 dims, HWC or CHW, or of 2 dims); use policy=mlp")
    trained = run_train(*game, "policy=mlp", run_dir=tmp_path / "mlp")
    assert trained.returncode == 0, trained.stderr
    assert "eval/win_rate/lookahead" in read_stats(tmp_path / "mlp")[-1]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_self_play_learns_connect_four_well_enough_to_beat_random_play(tmp_path):
    """The defaults of turn-based games (APPO, tuning/board_game_appo.yaml, policy=cnn), self-play alone: within 100k seat
    steps the greedy policy beats a random player in most games (a random policy wins about half)."""
    run_dir = tmp_path / "run"
    result = run_train("+env=connect_four", "max_env_steps=100000", "seed=1", run_dir=run_dir, timeout=580)
    assert result.returncode == 0, result.stderr
    rows = read_stats(run_dir)
    rates = [r["eval/win_rate/random"] for r in rows if "eval/win_rate/random" in r]
    assert rates[-1] >= 0.8, rates
