"""Chunked CSV reading with errors that name the file and the problem (empty, truncated, malformed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from trainyard_contract.runtime import StageError


def read_chunks(path: Path, chunk_rows: int, columns: list[str] | None = None) -> Iterator[tuple[pd.DataFrame, int]]:
    """Yield (frame, bytes read) for each chunk of `path`.

    Memory is bounded by `chunk_rows`. The frame's index is the 0-based row number within the file, so
    `index + 2` is the line number (line 1 is the header).
    """
    if path.stat().st_size == 0:
        raise StageError(f"{path.name}: file is empty (0 bytes; expected a CSV header and rows)")
    usecols = None
    with path.open("rb") as handle:
        header = handle.readline().decode("utf-8", errors="replace").strip().split(",")
        if columns is not None:
            usecols = [c for c in header if c in set(columns)] or None
        handle.seek(0)
        position = 0
        rows_seen = 0
        try:
            reader = pd.read_csv(handle, chunksize=chunk_rows, usecols=usecols, encoding="utf-8")
            for chunk in reader:
                chunk.attrs["header"] = header  # the file's own columns, also those not read
                now = handle.tell()
                yield chunk, max(now - position, 0)
                position = now
                rows_seen += len(chunk)
        except pd.errors.EmptyDataError:
            raise StageError(f"{path.name}: no CSV header found") from None
        except pd.errors.ParserError as exc:
            raise StageError(f"{path.name}: malformed CSV: {str(exc).strip()}") from None
        except UnicodeDecodeError as exc:
            raise StageError(f"{path.name}: not UTF-8 text at byte {exc.start}") from None
    if rows_seen == 0:
        raise StageError(f"{path.name}: has a header but no data rows")


def header_of(chunk: pd.DataFrame) -> list[str]:
    """The header of the file a chunk came from (every column, also those it did not read)."""
    return list(chunk.attrs.get("header", chunk.columns))


def truncated_rows(chunk: pd.DataFrame) -> pd.Index:
    """Rows whose last two or more fields are all missing: what a line cut short (a partial write) looks like."""
    if chunk.shape[1] < 3:
        return chunk.index[:0]
    trailing = chunk.iloc[:, ::-1].isna().cummin(axis=1).sum(axis=1)
    return chunk.index[trailing >= 2]
