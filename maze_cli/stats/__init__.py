"""Epoch statistics: aggregation and the writers (console, stats.jsonl, TensorBoard)."""

from maze_cli.stats.aggregator import EpochStatsAggregator, LogStatsLevel

__all__ = ["EpochStatsAggregator", "LogStatsLevel"]
