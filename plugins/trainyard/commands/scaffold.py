"""`trainyard new`: everything a pipeline of one's own needs, written together and checked together.

Three files: the config (`pipelines_config/<name>.yaml`, features, dtypes and ranges inferred from a sample CSV
or Parquet file; a column whose name is not an identifier is mapped with `source_column`),
the DAG shim (`<dags folder>/<name>.py`), and a model module to edit
(`images/trainer/trainyard_trainer/models/<name>.py`, inside the trainer package, so the trainer image and the
local backend both import it as `trainyard_trainer.models.<name>`). With `--from`, the sample also becomes the
dataset's first partition, so `trainyard run <name>` works at once. `trainyard check` then checks that configs
and shims pair up and that each model module can be found and compiles.
"""

from __future__ import annotations

import ast
import datetime as dt
import importlib.util
import json
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from trainyard_contract import layout
from trainyard_contract.schema import IDENTIFIER, SOURCE_COLUMN_MAX, SourceColumn

NAME = re.compile(r"^[a-z][a-z0-9_]{0,50}$")
COLUMN = re.compile(IDENTIFIER)
SOURCE_COLUMN = TypeAdapter(SourceColumn)  # what `source_column` accepts: the schema's own rule
MODELS_PACKAGE = "trainyard_trainer.models"
MAX_CLASSES = 100

TEMPLATES = Path(__file__).parent / "templates"  # `str.format` templates: {name} is the pipeline's name
MODEL_TEMPLATE = "model_template.py.tmpl"  # beside the built-in models, in the trainer package


class ScaffoldError(Exception):
    """What stops `trainyard new`, in words that say what to change."""


@dataclass(frozen=True)
class Written:
    config: Path
    shim: Path
    model: Path | None  # None: no trainer package here, the built-in model is used
    data: Path | None
    notes: list[str]


def yaml_value(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same float: a bound never narrows
    if isinstance(value, str):
        plain = re.fullmatch(r"[A-Za-z0-9_.-]+", value) and value.lower() not in (
            "yes", "no", "true", "false", "null", "on", "off", "y", "n", "~")
        return value if plain else json.dumps(value)  # a JSON string is a YAML double-quoted scalar
    return str(value)


def read_sample(sample: Path) -> tuple[Any, str]:
    """(frame, data format) of a sample: Parquet by its magic bytes (whatever the suffix), else CSV."""
    try:
        import pandas as pd
    except ModuleNotFoundError:
        raise ScaffoldError("reading a --from sample needs pandas and pyarrow, which this Airflow does not have: "
                            "`pip install pandas pyarrow`, or run `trainyard new` in a checkout") from None

    with sample.open("rb") as handle:
        magic = handle.read(4)
    if magic == b"PAR1":
        import pyarrow as pa

        try:
            return pd.read_parquet(sample), "parquet"
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise ScaffoldError(f"{sample}: a Parquet file pandas cannot read ({str(exc).strip()})") from None
    try:
        return pd.read_csv(sample), "csv"
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ScaffoldError(f"{sample}: neither a Parquet file nor a CSV file pandas can read "
                            f"({str(exc).strip()})") from None


def valid_source_column(name: str) -> bool:
    try:
        SOURCE_COLUMN.validate_python(name)
    except ValidationError:
        return False
    return True


def served_names(columns: list[str]) -> dict[str, str]:
    """{source column: served name}: a name that is not an identifier (`od280/od315_of_diluted_wines`,
    `sepal length (cm)`) becomes one (`od280_od315_of_diluted_wines`, `sepal_length_cm`), unique among all."""
    names: dict[str, str] = {}
    taken = {c for c in columns if COLUMN.match(c)}
    for column in columns:
        if COLUMN.match(column):
            names[column] = column
            continue
        base = re.sub(r"[^A-Za-z0-9_]+", "_", column).strip("_") or "column"
        if base[0].isdigit():
            base = f"c_{base}"
        name, n = base, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        taken.add(name)
        names[column] = name
    return names


def unsupported_type(column: Any) -> str | None:
    """Why validation would refuse this column's stored type as any feature (README: how strictly types are
    matched), or None: such a column is left out of the config, and the note says how to store it instead."""
    kind = column.dtype.kind
    if kind == "b":
        return "booleans are not a feature type: store it as integers 0/1 (dtype int) or as text"
    if kind == "u":
        return f"unsigned integers ({column.dtype}) are refused by validation: store it as a signed integer"
    if kind in "mM":
        return f"dates and times ({column.dtype}) are not a feature type: derive numbers from it first"
    if getattr(column.dtype, "name", "") == "category":
        return "a dictionary-encoded (category) column is refused by validation: store it as plain text"
    return None


def infer(sample: Path, label: str, task: str | None = None) -> tuple[list[str], list[str], list[str], int, str]:
    """(feature lines, label lines, notes, rows, data format) for the config, from the sample's columns.
    `task`: regression or classification, else inferred (a non-integer label is regression)."""
    frame, data_format = read_sample(sample)
    if frame.empty:
        raise ScaffoldError(f"{sample}: has a header but no rows; give a sample with data")
    frame.columns = [str(c) for c in frame.columns]
    names = checked_names(sample, frame, label)
    notes: list[str] = []
    mapped = [c for c in frame.columns if names[c] != c]
    if mapped:
        notes.append(f"{len(mapped)} column name(s) are not identifiers and are served under one: "
                     + ", ".join(f"{c!r} -> {names[c]}" for c in mapped[:5])
                     + (" ..." if len(mapped) > 5 else "") + " (source_column in the config)")
    features = feature_lines(frame, label, names, notes)
    if not features:
        raise ScaffoldError(f"{sample}: no feature column besides the label {label!r} has two or more values")
    label_lines = label_section(frame, label, names, task, notes)
    notes.append("feature ranges are the sample's min and max: widen them in the config if later data may exceed "
                 "them")
    return features, label_lines, notes, len(frame), data_format


def checked_names(sample: Path, frame: Any, label: str) -> dict[str, str]:
    """Each column's served name; a column no `source_column` can name, or a label that is not a column, is an
    error that says what to change."""
    unusable = [c for c in frame.columns if not COLUMN.match(c) and not valid_source_column(c)]
    if unusable:
        raise ScaffoldError(f"{sample}: column name(s) {[c[:60] for c in unusable[:5]]} cannot be a source_column "
                            f"(a comma, a control character, nothing but spaces, or over {SOURCE_COLUMN_MAX} "
                            "characters): rename them in the file")
    if label not in frame.columns:
        close = [c for c in frame.columns if c.lower() == label.lower()]
        hint = f"; did you mean {close[0]!r}?" if close else f"; columns: {list(frame.columns)[:10]}"
        raise ScaffoldError(f"{sample}: no column {label!r} to use as the label{hint}")
    return served_names(list(frame.columns))


def feature_lines(frame: Any, label: str, names: dict[str, str], notes: list[str]) -> list[str]:
    """One config line per usable feature column (numbers with the sample's range, text as categorical); a column
    left out gets a note saying why."""
    features: list[str] = []
    for column_name in frame.columns:
        if column_name == label:
            continue
        column = frame[column_name]
        if column.dropna().nunique() < 2:
            notes.append(f"left out column {column_name!r}: it has {column.dropna().nunique()} distinct value(s) "
                         "in the sample, so it carries no information")
            continue
        unsupported = unsupported_type(column)
        if unsupported:
            notes.append(f"left out column {column_name!r}: {unsupported}")
            continue
        source = f", source_column: {yaml_value(column_name)}" if names[column_name] != column_name else ""
        nullable = ", nullable: true" if column.isna().any() else ""
        if column.dtype.kind not in "biuf":
            features.append(f"    - {{name: {names[column_name]}, dtype: string{source}{nullable}}}"
                            "  # text: a categorical feature")
            continue
        dtype = "int" if column.dtype.kind in "biu" else "float"
        parts = [f"name: {names[column_name]}", f"dtype: {dtype}",
                 f"min: {yaml_value(float(column.min()))}", f"max: {yaml_value(float(column.max()))}"]
        features.append("    - {" + ", ".join(parts) + source + nullable + "}")
    return features


def label_section(frame: Any, label: str, names: dict[str, str], task: str | None, notes: list[str]) -> list[str]:
    """The config's `label:` lines: a regression target, or a classifier's classes (whole numbers or text)."""
    values = frame[label].dropna()
    label_lines = [f"    name: {names[label]}"]
    if names[label] != label:
        label_lines.append(f"    source_column: {yaml_value(label)}")
    if frame[label].isna().any():
        notes.append(f"the sample has rows without a {label!r} value: validation will reject such rows")
    numeric = values.dtype.kind in "biuf"
    whole = numeric and bool((values == values.round()).all())
    if task == "regression" or (task is None and numeric and not whole):
        if not numeric:
            raise ScaffoldError(f"label {label!r} holds text; regression needs a numeric label "
                                "(use --task classification)")
        notes.append(f"label {label!r}: a regression pipeline (task: regression): "
                     + ("--task asked for it" if task else "its values are not all whole numbers"))
        return [*label_lines, "    task: regression"]
    if numeric and not whole:
        raise ScaffoldError(f"label {label!r} holds non-integer numbers; a classifier needs whole-number or "
                            "text classes (use --task regression to predict the number)")
    text = not numeric
    classes = sorted(values.astype(str if text else int).unique().tolist())
    if len(classes) < 2 or len(classes) > MAX_CLASSES:
        hint = " (use --task regression to predict it as a number)" if numeric and len(classes) > MAX_CLASSES else ""
        raise ScaffoldError(f"label {label!r} has {len(classes)} distinct value(s) in the sample; a classifier "
                            f"needs 2 to {MAX_CLASSES} classes{hint}")
    label_lines.append(f"    classes: [{', '.join(yaml_value(c) for c in classes)}]")
    if text:
        label_lines.append("    dtype: string")
    return label_lines


def config_text(name: str, features: list[str], label: list[str], rows: int, source: str,
                data_format: str = "csv", ports: tuple[int, int] | None = None, module: str | None = None) -> str:
    return f"""# Written by `trainyard new {name}`; edit freely. `trainyard check` validates it.
name: {name}
description: A Trainyard pipeline for {name}.
owner: ml-platform
schedule: null                # a cron, a preset such as "@daily", or {{asset: {source}}}
start_date: {dt.date.today().isoformat()}

data:
  source: {source}{chr(10) + "  format: parquet" if data_format == "parquet" else ""}
  label:
{chr(10).join(label)}
  features:
{chr(10).join(features)}
  expectations:
    min_rows: {max(1, min(rows, 1000))}
  split: {{eval_fraction: 0.2, seed: 7}}

training:
  strategy: parameter_server
  model:
    module: {module or f"{MODELS_PACKAGE}.{name}"}
    params: {{hidden_units: [64, 32]}}
  ps: {{replicas: 1}}
  workers: {{replicas: 1}}
  steps: 300
  batch_size: 64
  learning_rate: 0.01

{evaluation(label)}{deploy_section(ports)}"""


def deploy_section(ports: tuple[int, int] | None) -> str:
    """The ports the deploy step reaches the serving API on, when not the defaults (8500 gRPC, 8501 REST)."""
    if ports is None:
        return ""
    return (f"\ndeploy:                       # the local server: trainyard serve --grpc-port {ports[0]} "
            f"--rest-port {ports[1]}\n  grpc_port: {ports[0]}\n  rest_port: {ports[1]}\n")


DEFAULT_PORTS = (8500, 8501)


def port_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:`port` now."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def serving_ports(ours_running: bool) -> tuple[tuple[int, int] | None, str | None]:
    """(ports to write, note): None (the defaults) when they are free or Trainyard's own local server holds
    them (it serves every pipeline's models); else two free ports, and a note that says which and why."""
    taken = [str(port) for port in DEFAULT_PORTS if not port_free(port)]
    if ours_running or not taken:
        return None, None
    chosen: list[int] = []
    sockets = []
    try:
        for _ in DEFAULT_PORTS:  # held until both are picked, so the two differ
            held = socket.socket()
            held.bind(("127.0.0.1", 0))
            sockets.append(held)
            chosen.append(held.getsockname()[1])
    finally:
        for held in sockets:
            held.close()
    return (chosen[0], chosen[1]), (
        f"port(s) {', '.join(taken)} are held by another program (not a Trainyard server): deploy.grpc_port "
        f"{chosen[0]} and deploy.rest_port {chosen[1]} are free now; start the local server on them with "
        f"`trainyard serve --grpc-port {chosen[0]} --rest-port {chosen[1]} --background`")


def evaluation(label: list[str]) -> str:
    """A starting evaluation section for the task the label lines say."""
    if any("task: regression" in line for line in label):
        return "evaluation:\n  metrics: [rmse, mae, r2, loss]\n  thresholds:\n    r2: {min: 0.0}\n"
    return "evaluation:\n  metrics: [accuracy, loss]\n  thresholds:\n    accuracy: {min: 0.5}\n"


def installed_models_dir() -> Path | None:
    """The folder of the trainer's model modules (`images/trainer/trainyard_trainer/models/` in a checkout), or
    None where the trainer's package is not installed (an Airflow with only Trainyard's wheel)."""
    try:
        spec = importlib.util.find_spec(MODELS_PACKAGE)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def models_dir() -> Path:
    """`installed_models_dir()`, or a ScaffoldError that says what to install."""
    found = installed_models_dir()
    if found is None:
        raise ScaffoldError(f"{MODELS_PACKAGE} is not installed here: run `make bootstrap` first")
    return found


BUILT_IN_MODEL = "trainyard_trainer.models.mlp"


def new_pipeline(name: str, sample: Path | None, label: str | None, *, pipelines: Path, dags: Path,
                 models: Path | None = None, volume: Path | None = None, force: bool = False,
                 task: str | None = None, serving_running: bool = False) -> Written:
    """Write the three files (and the first partition); refuse to overwrite without `force`. `task` forces
    regression or classification; `serving_running`: Trainyard's own local server holds the default ports.
    Where the trainer's package is not installed (Trainyard's wheel in an existing Airflow) no model module is
    written: the config uses the built-in MLP, and the note says how to add one's own."""
    models = models or installed_models_dir()
    if not NAME.match(name):
        raise ScaffoldError(f"{name!r} is not a pipeline name: lowercase letters, digits and '_' "
                            "(it is also a Python module name and an Airflow DAG id)")
    config, shim = pipelines / f"{name}.yaml", dags / f"{name}.py"
    model = models / f"{name}.py" if models is not None else None
    existing = [str(p) for p in (config, shim, model) if p is not None and p.exists()]
    if existing and not force:
        raise ScaffoldError(f"{', '.join(existing)} already exist(s); use --force to overwrite")
    source = f"{layout.DATASETS}/{name}"
    if sample is not None:
        if not sample.is_file():
            raise ScaffoldError(f"{sample}: no such file")
        if label is None:
            raise ScaffoldError("--label COLUMN is required with --from (which column is the class to predict?)")
        features, labels, notes, rows, data_format = infer(sample, label, task)  # the sample is read once
    else:
        if task is not None:
            raise ScaffoldError("--task needs a --from sample (it says what the sample's label is)")
        data_format = "csv"
        features = ["    - {name: x_0, dtype: float}", "    - {name: x_1, dtype: float}"]
        labels = ["    name: label", "    classes: [0, 1]"]
        notes = ["no --from sample: the features are placeholders; edit data.features and data.label"]
        rows = 1
    from trainyard_contract.atomic import write_bytes

    ports, port_note = serving_ports(serving_running)
    if port_note:
        notes.append(port_note)
    module = f"{MODELS_PACKAGE}.{name}" if models is not None else BUILT_IN_MODEL
    if models is None:
        notes.append(f"the trainer's package is not installed here, so no model module was written: the config "
                     f"uses the built-in {BUILT_IN_MODEL}; to train your own, add a module with "
                     "build_model(params, schema) to your trainer image and name it in training.model.module")
    write_bytes(config, config_text(name, features, labels, rows, source, data_format, ports, module).encode())
    write_bytes(shim, (TEMPLATES / "dag_shim.py.tmpl").read_text().format(name=name).encode())
    if model is not None and models is not None:
        write_bytes(model, (models / MODEL_TEMPLATE).read_text().format(name=name).encode())
    data = None
    if sample is not None and volume is not None:
        data = layout.dataset_dir(volume, name) / f"date={dt.date.today().isoformat()}" / f"part-0.{data_format}"
        if not data.exists():
            data.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(sample, data)
    return Written(config=config, shim=shim, model=model, data=data, notes=notes)


def model_module_problem(module: str) -> str | None:
    """Why `module` cannot be the model module (not found, does not compile, no `build_model`), without
    importing it: TensorFlow stays out of `trainyard check`."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        return f"cannot be imported: {exc}"
    if spec is None or spec.origin is None:
        return (f"module {module!r} is not found: put it in images/trainer/trainyard_trainer/models/ (as "
                "`trainyard_trainer.models.<name>`), or install it in every training image")
    path = Path(spec.origin)
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as exc:
        return f"{path}:{exc.lineno}: does not compile: {exc.msg}"
    if not any(isinstance(node, ast.FunctionDef) and node.name == "build_model" for node in tree.body):
        return f"{path}: defines no build_model(params, schema)"
    return None


def pairing_problems(config_names: set[str], dags: Path) -> list[str]:
    """A config without a shim, and a shim without a config (by the `dag_from_config("<name>")` it calls)."""
    shims: dict[str, Path] = {}
    for path in sorted(dags.glob("*.py")):
        found = re.search(r"""dag_from_config\(\s*["']([^"']+)["']""", path.read_text(errors="replace"))
        if found:
            shims[found.group(1)] = path
    problems = [f"{name}: no DAG shim in {dags}: copy dags/digits.py to {dags / (name + '.py')} and put {name!r} "
                "in its dag_from_config call" for name in sorted(config_names - set(shims))]
    problems += [f"{path}: builds pipeline {name!r}, which has no config" for name, path in sorted(shims.items())
                 if name not in config_names]
    return problems
