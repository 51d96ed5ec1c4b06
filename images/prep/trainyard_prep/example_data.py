"""Example datasets written as dated CSV partitions on the volume; nothing is downloaded.

`digits`: scikit-learn's bundled 8x8 handwritten digits (1,797 rows, shipped inside the package), spread over
consecutive days. `synthetic`: any number of rows of a seeded classification problem, for scale tests.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd

from trainyard_contract.atomic import write_bytes


def _write_partition(folder: Path, frame: pd.DataFrame, name: str = "part-0.csv") -> Path:
    path = folder / name
    write_bytes(path, frame.to_csv(index=False).encode())
    return path


def write_digits(dataset_dir: Path, days: int = 5, end: dt.date | None = None) -> list[Path]:
    """The digits dataset as `days` partitions `date=...` ending at `end` (default: yesterday, UTC)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    frame = pd.DataFrame(digits.data, columns=[f"pixel_{i}" for i in range(digits.data.shape[1])])
    frame["digit"] = digits.target
    last = end or (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1))
    paths = []
    for i, part in enumerate(np.array_split(np.arange(len(frame)), days)):
        day = last - dt.timedelta(days=days - 1 - i)
        paths.append(_write_partition(dataset_dir / f"date={day.isoformat()}", frame.iloc[part]))
    return paths


def write_synthetic(dataset_dir: Path, rows: int, features: int = 16, classes: int = 2, days: int = 1,
                    end: dt.date | None = None, seed: int = 0, chunk_rows: int = 200_000) -> list[Path]:
    """`rows` rows of `features` float columns (`f_0`..) and a `label` in [0, classes), written in chunks."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(features, classes))
    last = end or (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1))
    paths = []
    per_day = [len(p) for p in np.array_split(np.arange(rows), days)]
    for i, count in enumerate(per_day):
        day = last - dt.timedelta(days=days - 1 - i)
        folder = dataset_dir / f"date={day.isoformat()}"
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / "part-0.csv"
        tmp = folder / ".part-0.csv.tmp"
        with tmp.open("w") as handle:
            written = 0
            while written < count:
                n = min(chunk_rows, count - written)
                x = rng.normal(size=(n, features)).round(4)
                y = np.argmax(x @ weights + rng.normal(scale=0.5, size=(n, classes)), axis=1)
                frame = pd.DataFrame(x, columns=[f"f_{j}" for j in range(features)])
                frame["label"] = y
                frame.to_csv(handle, index=False, header=written == 0)
                written += n
        tmp.replace(final)
        paths.append(final)
    return paths
