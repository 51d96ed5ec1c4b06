"""A paired bootstrap of a metric's improvement: is the challenger better than the champion on these rows, or is
the difference what another sample of the same size could show by chance?

Both models were scored on the same eval rows, so each resample draws row indices once and recomputes the metric
for both on the same rows (paired: row-to-row variation cancels, as in Koehn's paired bootstrap for MT and TFX's
model-validation confidence intervals). The improvement is signed so that positive is better whatever the metric's
direction. Seeded: the same rows give the same interval. numpy only (no TensorFlow): a unit test runs it on arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SEED = 20260801  # fixed: a decision can be reproduced from the same rows
WORK_PER_DECISION = 20_000_000  # rows x resamples: 1,000 resamples up to 20k eval rows, fewer beyond


def resample_count(rows: int, most: int = 1000, fewest: int = 200) -> int:
    """1,000 resamples on up to 20k rows; beyond that, fewer (never under 200) so a 1M-row eval split does not
    spend minutes here. 200 resamples still place a 95% lower bound within about a standard error's tenth."""
    return max(fewest, min(most, WORK_PER_DECISION // max(rows, 1)))


@dataclass(frozen=True)
class Interval:
    improvement: float  # on all rows; positive: the challenger is better
    lower: float  # the one-sided lower confidence bound of the improvement
    upper: float  # the one-sided upper bound at the same confidence, for the report
    p_value: float  # share of resamples that show no improvement (one-sided, H0: improvement <= 0)
    confidence: float
    resamples: int
    rows: int

    def as_dict(self) -> dict[str, float | int]:
        return {"improvement": round(self.improvement, 6), "lower": round(self.lower, 6),
                "upper": round(self.upper, 6), "p_value": round(self.p_value, 6), "confidence": self.confidence,
                "resamples": self.resamples, "rows": self.rows, "seed": SEED}


def paired_bootstrap(improvement: Callable[[np.ndarray], float], rows: int, confidence: float,
                     resamples: int | None = None, seed: int = SEED) -> Interval:
    """`improvement(indices)` is the challenger's gain over the champion on the rows `indices` (with repeats).

    The lower bound is the (1 - confidence) quantile of the resampled improvements, so "lower > 0" reads "better
    at that confidence"; the p-value counts resamples at or below zero, with the usual +1 so it is never 0."""
    if rows < 2:
        raise ValueError(f"a bootstrap needs at least 2 rows, got {rows}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    count = resamples or resample_count(rows)
    generator = np.random.default_rng(seed)
    observed = float(improvement(np.arange(rows)))
    draws = np.empty(count, dtype=np.float64)
    for i in range(count):
        draws[i] = improvement(generator.integers(0, rows, size=rows))
    draws = draws[np.isfinite(draws)]  # a resample without one class can leave AUC undefined
    if not len(draws):
        raise ValueError("the metric is undefined on every resample of these rows")
    tail = 1.0 - confidence
    return Interval(improvement=observed, lower=float(np.quantile(draws, tail)),
                    upper=float(np.quantile(draws, confidence)),
                    p_value=float((np.count_nonzero(draws <= 0.0) + 1) / (len(draws) + 1)),
                    confidence=confidence, resamples=len(draws), rows=rows)
