"""Example datasets written as dated CSV partitions on the volume; nothing is downloaded.

`digits`: scikit-learn's bundled 8x8 handwritten digits (1,797 rows, shipped inside the package), spread over
consecutive days. `diabetes`: scikit-learn's bundled diabetes regression data (442 rows, 10 float features, a
float target). `churn`: a seeded customer-churn table with string, int-categorical, nullable and numeric columns
and a string label, as Parquet. `synthetic`: any number of rows of a seeded classification problem (CSV or
Parquet), for scale tests.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd

from trainyard_contract.atomic import write_bytes


def _write_partition(folder: Path, frame: pd.DataFrame, name: str = "part-0.csv") -> Path:
    path = folder / name
    if path.suffix == ".parquet":
        import io

        buffer = io.BytesIO()
        frame.to_parquet(buffer, index=False, engine="pyarrow")
        write_bytes(path, buffer.getvalue())
    else:
        write_bytes(path, frame.to_csv(index=False).encode())
    return path


def _days(last: dt.date | None, days: int) -> list[dt.date]:
    end = last or (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1))
    return [end - dt.timedelta(days=days - 1 - i) for i in range(days)]


def _write_days(dataset_dir: Path, frame: pd.DataFrame, days: int, end: dt.date | None, name: str) -> list[Path]:
    return [_write_partition(dataset_dir / f"date={day.isoformat()}", frame.iloc[part], name)
            for day, part in zip(_days(end, days), np.array_split(np.arange(len(frame)), days), strict=True)]


def write_diabetes(dataset_dir: Path, days: int = 3, end: dt.date | None = None) -> list[Path]:
    """scikit-learn's diabetes data (disease progression after one year, a float) as CSV partitions."""
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes(as_frame=True)
    frame = bunch.data.round(6)
    frame["progression"] = bunch.target.astype(float)
    return _write_days(dataset_dir, frame, days, end, "part-0.csv")


CHURN_COUNTRIES = ["US", "DE", "FR", "GB", "IN", "BR", "JP", "ES", "IT", "NL", "SE", "PL"]


def churn_frame(rows: int, seed: int = 0) -> pd.DataFrame:
    """A churn table whose label depends on every kind of feature: the plan and country (strings), the device
    (an int category), tenure and support calls (ints), and the monthly spend (a float, sometimes missing)."""
    rng = np.random.default_rng(seed)
    plans = np.array(["basic", "plus", "pro", "enterprise"])
    plan = rng.choice(plans, size=rows, p=[0.4, 0.3, 0.2, 0.1])
    weights = np.array([0.3, 0.12, 0.1, 0.1, 0.1, 0.08, 0.06, 0.05, 0.04, 0.03, 0.015, 0.005])
    country = rng.choice(CHURN_COUNTRIES, size=rows, p=weights / weights.sum())
    device = rng.choice([1, 2, 3], size=rows, p=[0.5, 0.3, 0.2])
    tenure = rng.integers(1, 73, size=rows)
    calls = rng.poisson(2.0, size=rows)
    spend = rng.gamma(4.0, 15.0, size=rows).round(2)
    plan_effect = pd.Series(plan).map({"basic": 1.4, "plus": 0.4, "pro": -0.4, "enterprise": -1.4}).to_numpy()
    country_effect = np.where(np.isin(country, ["IN", "BR"]), 0.9, np.where(country == "DE", -0.7, 0.0))
    device_effect = np.where(device == 3, 0.9, 0.0)
    logit = (plan_effect + country_effect + device_effect - 0.05 * (tenure - 36) + 0.45 * (calls - 2)
             + 0.01 * (spend - 60) + rng.normal(scale=0.3, size=rows))
    churned = np.where(rng.random(rows) < 1 / (1 + np.exp(-logit)), "churn", "stay")
    spend_or_missing = np.where(rng.random(rows) < 0.05, np.nan, spend)
    return pd.DataFrame({"plan": plan, "country": country, "device": device, "tenure_months": tenure,
                         "support_calls": calls, "monthly_spend": spend_or_missing, "churned": churned})


def write_churn(dataset_dir: Path, rows: int = 6000, days: int = 3, end: dt.date | None = None,
                seed: int = 0) -> list[Path]:
    """The churn table as Parquet partitions."""
    return _write_days(dataset_dir, churn_frame(rows, seed), days, end, "part-0.parquet")


def write_digits(dataset_dir: Path, days: int = 5, end: dt.date | None = None) -> list[Path]:
    """The digits dataset as `days` partitions `date=...` ending at `end` (default: yesterday, UTC)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    frame = pd.DataFrame(digits.data, columns=[f"pixel_{i}" for i in range(digits.data.shape[1])])
    frame["digit"] = digits.target
    return _write_days(dataset_dir, frame, days, end, "part-0.csv")


def write_synthetic(dataset_dir: Path, rows: int, features: int = 16, classes: int = 2, days: int = 1,
                    end: dt.date | None = None, seed: int = 0, chunk_rows: int = 200_000,
                    file_format: str = "csv") -> list[Path]:
    """`rows` rows of `features` float columns (`f_0`..) and a `label` in [0, classes), written in chunks.

    The same seed gives the same table in either format (Parquet: one row group per chunk)."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(features, classes))
    paths = []
    per_day = [len(p) for p in np.array_split(np.arange(rows), days)]
    for day, count in zip(_days(end, days), per_day, strict=True):
        folder = dataset_dir / f"date={day.isoformat()}"
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"part-0.{file_format}"
        tmp = folder / f".part-0.{file_format}.tmp"
        writer = None
        with tmp.open("wb") as handle:
            written = 0
            while written < count:
                n = min(chunk_rows, count - written)
                x = rng.normal(size=(n, features)).round(4)
                y = np.argmax(x @ weights + rng.normal(scale=0.5, size=(n, classes)), axis=1)
                frame = pd.DataFrame(x, columns=[f"f_{j}" for j in range(features)])
                frame["label"] = y
                if file_format == "parquet":
                    import pyarrow as pa
                    import pyarrow.parquet as pq

                    table = pa.Table.from_pandas(frame, preserve_index=False)
                    writer = writer or pq.ParquetWriter(handle, table.schema)
                    writer.write_table(table)
                else:
                    handle.write(frame.to_csv(index=False, header=written == 0).encode())
                written += n
            if writer is not None:
                writer.close()
        tmp.replace(final)
        paths.append(final)
    return paths
