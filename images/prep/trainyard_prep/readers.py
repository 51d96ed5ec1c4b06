"""Chunked reading of CSV and Parquet files with errors that name the file and the problem.

Both readers yield pandas frames whose index is the 0-based row number within the file, and record in the
frame's attrs the file's header and how a row is named in messages: `line N` for CSV (line 1 is the header),
`row N` for Parquet. Memory is bounded by the chunk size either way (Parquet is read one record batch at a time).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pandas as pd

from trainyard_contract.runtime import StageError
from trainyard_contract.schema import DataConfig

T = TypeVar("T")
_DONE = object()


def read_chunks(path: Path, chunk_rows: int, columns: list[str] | None = None,
                text_columns: frozenset[str] = frozenset(),
                sources: Mapping[str, str] | None = None) -> Iterator[tuple[pd.DataFrame, int]]:
    """Yield (frame, bytes read) for each chunk of `path`, a `.csv` or `.parquet` file.

    `text_columns` are read as text from CSV (a string column of digits stays "007", not 7). `sources` maps a
    served name to the file's own column name (`source_column` in the config): the file's column is read and
    handed on under the served name, also in the header the chunk records, so every later check speaks of the
    served name.
    """
    sources = dict(sources or {})
    served = {source: name for name, source in sources.items()}
    wanted = None if columns is None else [sources.get(c, c) for c in columns]
    text = frozenset(sources.get(c, c) for c in text_columns)
    if path.suffix == ".parquet":
        chunks = read_parquet_chunks(path, chunk_rows, wanted)
    else:
        chunks = read_csv_chunks(path, chunk_rows, wanted, text)
    for chunk, nbytes in chunks:
        if served:
            chunk.rename(columns=served, inplace=True)
            chunk.attrs["header"] = [served.get(c, c) for c in chunk.attrs["header"]]
            chunk.attrs["sources"] = sources
        yield chunk, nbytes


@dataclass(frozen=True)
class FileChunk:
    """A chunk of one of several files read as one stream (`chunks_of_files`), or the error that ended that
    file's chunks."""

    file: int  # the file's index in the list read
    frame: pd.DataFrame | None
    nbytes: int
    error: StageError | None = None


def chunks_of_files(paths: list[Path], chunk_rows: int, columns: list[str] | None = None,
                    text_columns: frozenset[str] = frozenset(),
                    sources: Mapping[str, str] | None = None) -> Iterator[FileChunk]:
    """Every chunk of every file, in order, as one stream: under `prefetched`, the next file's first chunk is
    parsed while the stage works on this file's last (a daily partition is often a single chunk, which read file
    by file was never read ahead). A file that cannot be read ends its part of the stream with a FileChunk that
    holds the StageError, and the next file follows."""
    for index, path in enumerate(paths):
        try:
            for frame, nbytes in read_chunks(path, chunk_rows, columns, text_columns, sources):
                yield FileChunk(index, frame, nbytes)
        except StageError as exc:
            yield FileChunk(index, None, 0, exc)


def _object_text(chunk: pd.DataFrame) -> pd.DataFrame:
    """Text columns as object dtype: pandas 3 reads text as its `str` dtype, which Great Expectations 1.x's
    type expectations do not recognise under any name; object columns of Python str it checks as "object"."""
    for name in chunk.columns:
        if isinstance(chunk[name].dtype, pd.StringDtype):
            chunk[name] = chunk[name].astype(object)
    return chunk


def row_name(chunk: pd.DataFrame, index: int) -> str:
    """How a message names row `index` (0-based within its file) of a chunk: `line 4` (CSV) or `row 3`."""
    if chunk.attrs.get("format") == "parquet":
        return f"row {int(index) + 1}"
    return f"line {int(index) + 2}"


def read_parquet_chunks(path: Path, chunk_rows: int,
                        columns: list[str] | None = None) -> Iterator[tuple[pd.DataFrame, int]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.stat().st_size == 0:
        raise StageError(f"{path.name}: file is empty (0 bytes; expected a Parquet file)")
    try:
        # pre_buffer (pyarrow's default) reads every column chunk of the file ahead: memory grew with the file
        # (10x rows, 1.7x peak); without it a chunk's row groups are read as they are needed
        handle = pq.ParquetFile(path, pre_buffer=False)
    except (pa.ArrowException, OSError) as exc:
        raise StageError(f"{path.name}: not a readable Parquet file: {str(exc).splitlines()[0]}") from None
    header = list(handle.schema_arrow.names)
    wanted = [c for c in header if columns is None or c in set(columns)]
    total_rows = max(handle.metadata.num_rows, 1)
    size = path.stat().st_size
    rows_seen = 0
    try:
        for batch in handle.iter_batches(batch_size=chunk_rows, columns=wanted):
            chunk = _object_text(batch.to_pandas())
            del batch  # not held (a second copy of the chunk) while the stage works on the frame
            chunk.index = pd.RangeIndex(rows_seen, rows_seen + len(chunk))
            chunk.attrs["header"] = header
            chunk.attrs["format"] = "parquet"
            rows_seen += len(chunk)
            yield chunk, int(size * len(chunk) / total_rows)
    except (pa.ArrowException, OSError) as exc:
        raise StageError(f"{path.name}: cannot read Parquet rows after row {rows_seen}: "
                         f"{str(exc).splitlines()[0]}") from None
    if rows_seen == 0:
        raise StageError(f"{path.name}: has a schema but no data rows")


def read_csv_chunks(path: Path, chunk_rows: int, columns: list[str] | None = None,
                    text_columns: frozenset[str] = frozenset()) -> Iterator[tuple[pd.DataFrame, int]]:
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
            text = {c: str for c in header if c in text_columns}
            reader = pd.read_csv(handle, chunksize=chunk_rows, usecols=usecols, encoding="utf-8", dtype=text or None,
                                 keep_default_na=True)
            for chunk in reader:
                chunk = _object_text(chunk)
                chunk.attrs["header"] = header  # the file's own columns, also those not read
                chunk.attrs["format"] = "csv"
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
    """Rows whose last two or more fields are all missing: what a CSV line cut short (a partial write) looks like."""
    if chunk.shape[1] < 3 or chunk.attrs.get("format") == "parquet":
        return chunk.index[:0]
    trailing = chunk.iloc[:, ::-1].isna().cummin(axis=1).sum(axis=1)
    return chunk.index[trailing >= 2]


def text_columns(data: DataConfig) -> frozenset[str]:
    """Columns read as text: string features and a string label."""
    names = {f.name for f in data.columns() if f.dtype == "string"}
    if data.label.dtype == "string":
        names.add(data.label.name)
    return frozenset(names)


def prefetched(items: Iterable[T]) -> Iterator[T]:
    """`items`, each produced by a background thread while the stage works on the one before: the next chunk
    is read and parsed (pandas' and pyarrow's parsers release the GIL) during this one's work. The producer
    starts on an item only once the previous one was taken, so at most one chunk more than the stage's own is
    in memory. An error in the producer is raised here, in order; stopping early stops the producer."""
    slots: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def taken() -> bool:
        """Wait until the consumer took the last item (or stopped); False when it stopped."""
        with slots.all_tasks_done:
            while slots.unfinished_tasks and not stop.is_set():
                slots.all_tasks_done.wait(timeout=0.1)
        return not stop.is_set()

    def produce() -> None:
        try:
            for item in items:
                slots.put((item, None))
                if not taken():
                    return
            slots.put((_DONE, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            slots.put((_DONE, exc))

    thread = threading.Thread(target=produce, name="prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = slots.get()
            slots.task_done()
            if error is not None:
                raise error
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # a producer blocked on a full queue: take its item so it can see the stop
            try:
                slots.get_nowait()
                slots.task_done()
            except queue.Empty:
                thread.join(timeout=0.1)
