"""prepare_data's streaming statistics equal numpy's over the whole column, however the rows are chunked."""

from __future__ import annotations

import numpy as np
import pandas as pd

from trainyard_prep.prepare import RunningStats, class_indices


def test_chunked_statistics_equal_whole_column_statistics_with_and_without_missing_values() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(loc=[3.0, -50.0, 1e6], scale=[1.0, 10.0, 5.0], size=(10_001, 3))
    values[rng.random(10_001) < 0.1, 1] = np.nan  # the second column is nullable: 10% missing
    stats = RunningStats(["a", "b", "c"])
    for start in range(0, 10_001, 997):
        stats.update(values[start : start + 997])  # most chunks have NaNs; the fast path runs on none of them
    clean = RunningStats(["a", "c"])
    for start in range(0, 10_001, 997):
        clean.update(values[start : start + 997][:, [0, 2]])  # no NaN: the fast path on every chunk
    out, fast = stats.as_dict(), clean.as_dict()
    present = values[~np.isnan(values[:, 1]), 1]
    assert out["b"]["count"] == len(present) and out["b"]["missing"] == 10_001 - len(present)
    np.testing.assert_allclose([out["b"]["mean"], out["b"]["std"]], [present.mean(), present.std()], rtol=1e-9)
    assert (out["b"]["min"], out["b"]["max"]) == (present.min(), present.max())
    for name, column in (("a", 0), ("c", 2)):
        for result in (out, fast):
            np.testing.assert_allclose([result[name]["mean"], result[name]["std"]],
                                       [values[:, column].mean(), values[:, column].std()], rtol=1e-9)
            assert result[name]["count"] == 10_001 and result[name]["missing"] == 0
            assert (result[name]["min"], result[name]["max"]) == (values[:, column].min(), values[:, column].max())


def test_labels_map_to_class_indices_by_their_text() -> None:
    classes = {"0": 0, "7": 1, "-3": 2}
    ints = class_indices(pd.Series([7, 0, -3, 7, 5], dtype=np.int64), classes)
    assert ints.tolist()[:4] == [1, 0, 2, 1] and np.isnan(ints.iloc[4])
    text = class_indices(pd.Series(["stay", "churn", "gone"], dtype=object), {"stay": 0, "churn": 1})
    assert text.tolist()[:2] == [0, 1] and np.isnan(text.iloc[2])
