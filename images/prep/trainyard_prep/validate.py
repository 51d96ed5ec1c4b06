"""validate_data: a Great Expectations suite built from the config, run on the run's pinned input files.

Each file is read in chunks (memory stays bounded by `prep.rows_per_validation`), each chunk is one GE validation,
and the table-level row count is checked on the total. Results JSON and Data Docs (made to open offline) go to
`<run>/validation/` by temp-then-rename; a failure prints one line per problem, naming the file and column.

Files are validated in groups (`groups.py`): a group writes its file reports and GE results to
`parts/validate/<group>/`, and `finish_validation` joins the groups into `validation/` with one Data Docs site and
the table-level checks. A one-pod run is one group joined in the same process; with `prep.parallelism` above 1
each group is a mapped task and merge_data joins them.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import great_expectations as gx
import pandas as pd
from great_expectations.core.run_identifier import RunIdentifier
from great_expectations.data_context.types.base import ProgressBarsConfig

from trainyard_contract import layout
from trainyard_contract.atomic import staged_dir, write_json
from trainyard_contract.runtime import StageError
from trainyard_contract.schema import DataConfig, PipelineConfig
from trainyard_prep.datadocs import make_offline
from trainyard_prep.groups import group_entries, load_group_parts, load_groups
from trainyard_prep.progress import Progress, combined_throughput
from trainyard_prep.readers import chunks_of_files, header_of, prefetched, row_name, text_columns, truncated_rows

NUMERIC_TYPES = {"float": ["float64", "float32", "int64", "int32", "int16", "int8", "Float64", "Int64"],
                 "int": ["int64", "int32", "int16", "int8", "Int64"]}
STRING_TYPES = ["object", "str", "string", "StringDtype"]
SITE_NAME = "trainyard_run"
GE_RESULTS = "ge_results.json"  # a group's GE validation results, as GE's store serialises them
GROUP_SUMMARY = "summary.json"  # a group's file reports and label counts
FINITE = 1e300  # bounds of a regression label without min/max: any finite number


def missing_classes(data: DataConfig, counts: dict[str, int]) -> str | None:
    """A problem line when a configured class never occurs in the run's data (unless allowed)."""
    label = data.label
    if label.task != "classification" or label.allow_missing_classes:
        return None
    absent = [c for c in label.classes or [] if counts.get(str(c), 0) == 0]
    if not absent:
        return None
    table = ", ".join(f"{c}: {counts.get(str(c), 0)}" for c in label.classes or [])
    return (f"{label.name}: class(es) {absent} never occur in the data (rows per class: {table}); add data "
            f"that has them, remove them from data.label.classes, or set data.label.allow_missing_classes: true")


def build_suite(data: DataConfig, name: str) -> gx.ExpectationSuite:
    """Columns present, types, not-null, ranges and allowed values, from `data.features` and `data.label`."""
    suite = gx.ExpectationSuite(name=name)
    E = gx.expectations
    columns: list[tuple[str, str, Any]] = [(f.name, f.dtype, f) for f in data.columns()]
    label = data.label
    for name_, dtype, feature in columns:
        suite.add_expectation(E.ExpectColumnToExist(column=name_))
        types = STRING_TYPES if dtype == "string" else NUMERIC_TYPES[dtype]
        if feature.nullable and dtype == "int":
            types = types + ["float64"]
        suite.add_expectation(E.ExpectColumnValuesToBeInTypeList(column=name_, type_list=types))
        if not feature.nullable:
            suite.add_expectation(E.ExpectColumnValuesToNotBeNull(column=name_))
        if feature.min is not None or feature.max is not None:
            suite.add_expectation(
                E.ExpectColumnValuesToBeBetween(column=name_, min_value=feature.min, max_value=feature.max)
            )
        if feature.allowed:
            suite.add_expectation(E.ExpectColumnValuesToBeInSet(column=name_, value_set=list(feature.allowed)))
    suite.add_expectation(E.ExpectColumnToExist(column=label.name))
    suite.add_expectation(E.ExpectColumnValuesToNotBeNull(column=label.name))
    if label.task == "regression":
        suite.add_expectation(E.ExpectColumnValuesToBeInTypeList(column=label.name, type_list=NUMERIC_TYPES["float"]))
        # finite, and within the configured bounds: an inf label fails here, by GE, with its rows named
        low = label.min if label.min is not None else -FINITE
        high = label.max if label.max is not None else FINITE
        suite.add_expectation(E.ExpectColumnValuesToBeBetween(column=label.name, min_value=low, max_value=high))
        return suite
    suite.add_expectation(
        E.ExpectColumnValuesToBeInTypeList(
            column=label.name, type_list=STRING_TYPES if label.dtype == "string" else NUMERIC_TYPES["int"]
        )
    )
    suite.add_expectation(E.ExpectColumnValuesToBeInSet(column=label.name, value_set=list(label.classes or [])))
    return suite


@dataclass
class FileReport:
    file: str
    rows: int = 0
    chunks: int = 0
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "rows": self.rows, "chunks": self.chunks, "success": not self.problems,
                "problems": self.problems}


def _lines(index: pd.Index, chunk: pd.DataFrame, values: pd.Series | None = None, limit: int = 3) -> str:
    """`line 4: 99, line 9: 120` (with values) or `line 4, line 9` for the first rows of `index` (`row N` for
    Parquet)."""
    rows = list(index[:limit])
    if values is None:
        return ", ".join(row_name(chunk, i) for i in rows)
    return ", ".join(f"{row_name(chunk, i)}: {_plain(values[i])!r}" for i in rows)


def _plain(value: Any) -> Any:
    """A cell as the user wrote it: numpy scalars as Python numbers (99.0, not np.float64(99.0))."""
    return value.item() if hasattr(value, "item") else value


def _all_numbers(column: pd.Series) -> bool:
    present = column.notna()
    return bool((pd.to_numeric(column, errors="coerce").notna() | ~present).all())


def _failing(kind: str, kwargs: dict[str, Any], column: pd.Series) -> pd.Series | None:
    """The rows of `column` that fail a value expectation, computed here so the message can name real rows
    (GE's SUMMARY result counts them but shows no line numbers); None for a kind this cannot recompute."""
    present = column.notna()
    if kind == "expect_column_values_to_be_between":
        numbers = pd.to_numeric(column, errors="coerce")
        low, high = kwargs.get("min_value"), kwargs.get("max_value")
        outside = pd.Series(False, index=column.index)
        if low is not None:
            outside |= numbers < low
        if high is not None:
            outside |= numbers > high
        return present & outside
    if kind == "expect_column_values_to_be_in_set":
        allowed = kwargs.get("value_set") or []
        as_text = {str(v) for v in allowed}
        return present & ~(column.isin(allowed) | column.astype(str).isin(as_text))
    return None


def _describe(result: Any, chunk: pd.DataFrame, truncated: pd.Index, header: list[str],
              expected: list[str]) -> str | None:
    """One human line for a failed expectation result: how many rows, real values with their line numbers.

    The chunk's index is the row number within the file, so a row's line number is `index + 2` (after the header);
    `header` is the file's own header line, all of its columns; `expected` the columns the config names.
    """
    config = result.expectation_config
    kind = config.type
    column = config.kwargs.get("column")
    details = result.result or {}
    if kind != "expect_column_to_exist" and column is not None and column not in chunk.columns:
        return None  # reported once, by expect_column_to_exist
    if result.exception_info and result.exception_info.get("raised_exception"):
        return f"{column}: {kind} could not be evaluated (is the column's type wrong?)"
    if kind == "expect_column_to_exist":
        unknown = [name for name in header if name not in set(expected)]  # a typo is a column nobody expects
        close = difflib.get_close_matches(column, unknown, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        source = chunk.attrs.get("sources", {}).get(column)
        what = f"source column {source!r} is missing" if source else "column is missing"
        return f"{column}: {what} (the file has {len(header)} columns){hint}"
    if kind == "expect_column_values_to_be_in_type_list":
        values = chunk[column]
        observed = details.get("observed_value") or values.dtype.name
        if observed in ("object", "str") and values.map(lambda v: isinstance(v, str)).any():
            observed = "text"
        bad = pd.to_numeric(values, errors="coerce").isna() & values.notna()
        if not bad.any():
            if values.isna().any():
                return None  # blank cells make a numeric column float: reported as missing values, with lines
            return f"{column}: wrong type {observed} (expected one of {config.kwargs['type_list'][:3]}...)"
        rows = values.index[bad]
        return (f"{column}: {len(rows)} value(s) of the wrong type {observed} (expected one of "
                f"{config.kwargs['type_list'][:3]}...), {_lines(rows, chunk, values)}")
    if kind == "expect_column_values_to_not_be_null":
        empty = chunk.index[chunk[column].isna()].difference(truncated)
        if empty.empty:
            return None  # only truncated rows, reported on their own
        return f"{column}: {len(empty)} missing value(s) (empty or NaN cells), at {_lines(empty, chunk)}"
    if kind == "expect_column_values_to_be_between" and not _all_numbers(chunk[column]):
        return None  # values of the wrong type: reported by the type expectation, with their lines
    failing = _failing(kind, config.kwargs, chunk[column])
    if failing is not None and failing.any():
        rows = chunk.index[failing]
        bounds = {k: config.kwargs[k] for k in ("min_value", "max_value", "value_set") if config.kwargs.get(k)
                  is not None}
        rule = ", ".join(f"{k} {v!r}" for k, v in bounds.items())
        return f"{column}: {len(rows)} value(s) fail {kind} ({rule}): {_lines(rows, chunk, chunk[column])}"
    count = details.get("unexpected_count")
    sample = details.get("partial_unexpected_list") or []
    counted = f"{count} value(s)" if count is not None else "values"
    return f"{column}: {counted} fail {kind}" + (f", e.g. {sample[:3]}" if sample else "")


class SuiteRunner:
    """An ephemeral GE context with one pandas dataframe asset, validating chunk after chunk against one suite.

    Its results stay in the context's in-memory store until `stored_results` hands them over: a file group's
    results are written beside its reports, and `build_data_docs` renders every group's into one site.
    """

    def __init__(self, config: PipelineConfig):
        self.context = quiet_context()
        source = self.context.data_sources.add_pandas("trainyard")
        batch = source.add_dataframe_asset(config.data.source.replace("/", "_")).add_batch_definition_whole_dataframe(
            "chunk"
        )
        self.suite = self.context.suites.add(build_suite(config.data, config.name))
        self.definition = self.context.validation_definitions.add(
            gx.ValidationDefinition(name=f"{config.name}-inputs", data=batch, suite=self.suite)
        )

    def validate(self, frame: pd.DataFrame, run_name: str) -> Any:
        return self.definition.run(
            batch_parameters={"dataframe": frame},
            result_format="SUMMARY",
            run_id=RunIdentifier(run_name=run_name, run_time=dt.datetime.now(dt.UTC)),
        )

    def stored_results(self) -> list[list[Any]]:
        """Every validation result so far as `[key, serialized result]` pairs, as GE's store keeps them."""
        backend = self.context.validation_results_store.store_backend
        return [[list(key), backend.get(key)] for key in backend.list_keys() if not str(key[0]).startswith(".")]


def quiet_context() -> Any:
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    return context


def build_data_docs(config: PipelineConfig, docs_dir: Path, result_files: list[Path]) -> None:
    """One Data Docs site (made to open offline) for the suite and every validation result in `result_files`."""
    context = quiet_context()
    context.add_data_docs_site(
        site_name=SITE_NAME,
        site_config={
            "class_name": "SiteBuilder",
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        },
    )
    context.suites.add(build_suite(config.data, config.name))
    backend = context.validation_results_store.store_backend
    for path in result_files:
        for key, value in json.loads(path.read_text()):
            backend.set(tuple(key), value)
    context.build_data_docs(site_names=[SITE_NAME])
    make_offline(docs_dir)


def check_chunk(config: PipelineConfig, runner: SuiteRunner, report: FileReport, chunk: pd.DataFrame,
                name: str, expected: list[str], class_counts: dict[str, int], progress: Progress) -> None:
    """Validate one chunk of a file with the suite: count its classes, and add one line per problem (row
    numbers, column) to the file's report; `expected` are the columns the config names."""
    report.chunks += 1
    if config.data.label.task == "classification" and config.data.label.name in chunk.columns:
        for value, count in chunk[config.data.label.name].value_counts().items():
            key = str(value)  # counted first, then named: not a str() per row
            class_counts[key] = class_counts.get(key, 0) + int(count)
    report.rows += len(chunk)
    with progress.phase("great_expectations"):
        result = runner.validate(chunk, f"{name}-{report.chunks}")
    truncated = truncated_rows(chunk)
    for index in truncated[:5]:
        filled = int(chunk.loc[index].notna().sum())
        report.problems.append(
            f"{row_name(chunk, index)} is truncated: only {filled} of {chunk.shape[1]} fields have values"
        )
    for item in result.results:
        if not item.success:
            line = _describe(item, chunk, truncated, header_of(chunk), expected)
            if line and line not in report.problems:
                report.problems.append(line)


def validate_files(run_dir: Path, config: PipelineConfig, entries: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    """Validate one group of pinned files chunk by chunk, the files read as one stream (the next file is read
    ahead too); write its file reports (`summary.json`) and GE results to `out`. A file that cannot be read
    is a problem of that file, and the next one is validated."""
    progress = Progress("validate")
    class_counts: dict[str, int] = {}
    runner = SuiteRunner(config)
    expected = [c.name for c in config.data.columns()] + [config.data.label.name]
    reports = [FileReport(file=entry["source"]) for entry in entries]
    paths = [run_dir / entry["snapshot"] for entry in entries]
    stream = chunks_of_files(paths, config.prep.rows_per_validation(len(expected)), expected,
                             text_columns(config.data), config.data.source_columns())
    for item in progress.timed("read", prefetched(stream)):
        report = reports[item.file]
        if item.error is not None:
            report.problems.append(str(item.error))
            continue
        progress.add(len(item.frame), item.nbytes)
        name = f"{Path(entries[item.file]['source']).parent.name}-{paths[item.file].name}"
        check_chunk(config, runner, report, item.frame, name, expected, class_counts, progress)
    write_json(out / GE_RESULTS, runner.stored_results())
    summary = {"files": [r.as_dict() for r in reports], "label_counts": class_counts,
               "expectations": len(runner.suite.expectations), "throughput": progress.done()}
    write_json(out / GROUP_SUMMARY, summary)
    return summary


def problem_lines(files: list[dict[str, Any]]) -> list[str]:
    return [f"{f['file']}: {p}" for f in files for p in f["problems"]]


def validation_failed(source: str, lines: list[str], details: Path, docs: Path) -> StageError:
    shown = "\n".join(f"  - {line}" for line in lines[:50])
    more = f"\n  ... and {len(lines) - 50} more" if len(lines) > 50 else ""
    return StageError(f"data validation failed: {len(lines)} problem(s) in {source}\n{shown}{more}\n"
                      f"Details: {details}; Data Docs: {docs}")


def validate_group(run_dir: Path, config: PipelineConfig, manifest: dict[str, Any], group: int) -> dict[str, Any]:
    """One mapped validate_data task: validate file group `group` into `parts/validate/<group>/`. A group with a
    bad file fails here, naming it, with the group's own Data Docs; merge_data joins the groups that passed."""
    entries = group_entries(manifest, load_groups(run_dir), group)
    part = run_dir / layout.VALIDATION_PARTS / layout.group_name(group)
    with staged_dir(part) as out:
        summary = validate_files(run_dir, config, entries, out)
        lines = problem_lines(summary["files"])
        if lines:
            build_data_docs(config, out / layout.DATA_DOCS.name, [out / GE_RESULTS])
    if lines:
        raise validation_failed(manifest["source"], lines, part / GROUP_SUMMARY,
                                part / layout.DATA_DOCS_INDEX.name)
    return summary


def finish_validation(run_dir: Path, config: PipelineConfig, manifest: dict[str, Any],
                      parts: list[Path]) -> dict[str, Any]:
    """Join the groups' reports into `validation/results.json` and one Data Docs site, check the table as a whole
    (row count bounds, missing classes), and raise StageError listing every problem."""
    groups = load_group_parts(parts, GROUP_SUMMARY, "validate_data")
    files = [f for group in groups for f in group["files"]]
    class_counts: dict[str, int] = {}
    for group in groups:
        for key, count in group["label_counts"].items():
            class_counts[key] = class_counts.get(key, 0) + count
    total = sum(f["rows"] for f in files)
    limits = config.data.expectations
    table_problems = []
    if total < limits.min_rows:
        table_problems.append(f"{total} row(s) in total, fewer than data.expectations.min_rows={limits.min_rows}")
    if limits.max_rows is not None and total > limits.max_rows:
        table_problems.append(f"{total} row(s) in total, more than data.expectations.max_rows={limits.max_rows}")
    absent = missing_classes(config.data, class_counts)
    if absent:
        table_problems.append(absent)
    lines = problem_lines(files) + table_problems
    docs_started = time.monotonic()
    with staged_dir(run_dir / layout.VALIDATION) as out:
        build_data_docs(config, out / layout.DATA_DOCS.name, [part / GE_RESULTS for part in parts])
        throughput = combined_throughput([group["throughput"] for group in groups])
        throughput.setdefault("us_per_row", {})["data_docs"] = round(
            (time.monotonic() - docs_started) * 1e6 / max(total, 1), 3)
        summary = {
            "success": not lines,
            "rows": total,
            "files": files,
            "groups": len(parts),
            "table_problems": table_problems,
            "expectations": groups[0]["expectations"] if groups else 0,
            "label_counts": class_counts or None,
            "data_docs": layout.DATA_DOCS_INDEX.relpath,
            "throughput": throughput,
        }
        write_json(out / layout.VALIDATION_RESULTS.name, summary)
    if lines:
        raise validation_failed(manifest["source"], lines, run_dir / layout.VALIDATION_RESULTS,
                                run_dir / layout.DATA_DOCS_INDEX)
    return summary


def validate_inputs(run_dir: Path, config: PipelineConfig, manifest: dict[str, Any]) -> dict[str, Any]:
    """The one-pod validate_data: every pinned file as one group, then the same join a fanned-out run's
    merge_data does; writes `validation/`; raises StageError listing every problem."""
    part = run_dir / layout.VALIDATION_PARTS / layout.group_name(0)
    with staged_dir(part) as out:
        validate_files(run_dir, config, manifest["files"], out)
    return finish_validation(run_dir, config, manifest, [part])
