"""The statistics of a learning result over seeds, as the field reports them: mean and interquartile
mean (IQM), each with its 95% stratified-bootstrap interval, by rliable (extra `bench`)."""

from __future__ import annotations

import warnings

import numpy as np


def iqm_with_interval(values: list[float]) -> tuple[float, float, float, float, tuple[float, float]]:
    """Mean and IQM over one task's seeds, with their 95% bootstrap intervals:
    (mean, iqm, iqm_low, iqm_high, (mean_low, mean_high))."""
    from rliable import library as rly
    from rliable import metrics

    scores = {"x": np.asarray(values, dtype=float).reshape(-1, 1)}
    aggregate = lambda x: np.array([metrics.aggregate_mean(x), metrics.aggregate_iqm(x)])  # noqa: E731
    with warnings.catch_warnings():  # (arch, under rliable, prefers a Generator to the RandomState rliable passes it)
        warnings.simplefilter("ignore", FutureWarning)
        point, interval = rly.get_interval_estimates(scores, aggregate, reps=5000,
                                                     random_state=np.random.RandomState(0))  # a report prints the same twice
    (mean, iqm), ((mean_lo, iqm_lo), (mean_hi, iqm_hi)) = point["x"], interval["x"]
    return mean, iqm, iqm_lo, iqm_hi, (mean_lo, mean_hi)
