"""`trainyard new`: everything a pipeline of one's own needs, written together and checked together.

Three files: the config (`pipelines_config/<name>.yaml`, features, dtypes and ranges inferred from a sample CSV),
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
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard_contract import layout

NAME = re.compile(r"^[a-z][a-z0-9_]{0,50}$")
COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
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
    model: Path
    data: Path | None
    notes: list[str]


def yaml_value(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same float: a bound never narrows
    if isinstance(value, str):
        return repr(value) if not re.fullmatch(r"[A-Za-z0-9_.-]+", value) or value.lower() in (
            "yes", "no", "true", "false", "null", "on", "off") else value
    return str(value)


def infer(sample: Path, label: str) -> tuple[list[str], list[str], list[str], int]:
    """(feature lines, label lines, notes, rows) for the config, from the sample's columns."""
    import pandas as pd

    try:
        frame = pd.read_csv(sample)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ScaffoldError(f"{sample}: not a CSV file pandas can read ({str(exc).strip()})") from None
    if frame.empty:
        raise ScaffoldError(f"{sample}: has a header but no rows; give a sample with data")
    bad = [c for c in frame.columns if not COLUMN.match(str(c))]
    if bad:
        raise ScaffoldError(f"{sample}: column name(s) {bad[:5]} are not identifiers ([A-Za-z_][A-Za-z0-9_]*); "
                            "rename them in the file")
    if label not in frame.columns:
        close = [c for c in frame.columns if c.lower() == label.lower()]
        hint = f"; did you mean {close[0]!r}?" if close else f"; columns: {list(frame.columns)[:10]}"
        raise ScaffoldError(f"{sample}: no column {label!r} to use as the label{hint}")
    notes: list[str] = []
    features: list[str] = []
    for name in frame.columns:
        if name == label:
            continue
        column = frame[name]
        if column.dropna().nunique() < 2:
            notes.append(f"left out column {name!r}: it has {column.dropna().nunique()} distinct value(s) in the "
                         "sample, so it carries no information")
            continue
        nullable = ", nullable: true" if column.isna().any() else ""
        if column.dtype.kind not in "biuf":
            features.append(f"    - {{name: {name}, dtype: string{nullable}}}  # text: a categorical feature")
            continue
        dtype = "int" if column.dtype.kind in "biu" else "float"
        parts = [f"name: {name}", f"dtype: {dtype}",
                 f"min: {yaml_value(float(column.min()))}", f"max: {yaml_value(float(column.max()))}"]
        features.append("    - {" + ", ".join(parts) + nullable + "}")
    if not features:
        raise ScaffoldError(f"{sample}: no feature column besides the label {label!r} has two or more values")
    values = frame[label].dropna()
    if frame[label].isna().any():
        notes.append(f"the sample has rows without a {label!r} value: validation will reject such rows")
    if values.dtype.kind == "f" and not (values == values.round()).all():
        notes.append(f"label {label!r} holds non-integer numbers: a regression pipeline (task: regression)")
        labels = [f"    name: {label}", "    task: regression"]
        notes.append("feature ranges are the sample's min and max: widen them in the config if later data may "
                     "exceed them")
        return features, labels, notes, len(frame)
    text = values.dtype.kind not in "biuf"
    classes = sorted(values.astype(str if text else int).unique().tolist())
    if len(classes) < 2 or len(classes) > MAX_CLASSES:
        raise ScaffoldError(f"label {label!r} has {len(classes)} distinct value(s) in the sample; a classifier "
                            f"needs 2 to {MAX_CLASSES} classes")
    labels = [f"    name: {label}", f"    classes: [{', '.join(yaml_value(c) for c in classes)}]"]
    if text:
        labels.append("    dtype: string")
    notes.append("feature ranges are the sample's min and max: widen them in the config if later data may exceed "
                 "them")
    return features, labels, notes, len(frame)


def config_text(name: str, features: list[str], label: list[str], rows: int, source: str) -> str:
    return f"""# Written by `trainyard new {name}`; edit freely. `trainyard check` validates it.
name: {name}
description: A Trainyard pipeline for {name}.
owner: ml-platform
schedule: null                # a cron, a preset such as "@daily", or {{asset: {source}}}
start_date: {dt.date.today().isoformat()}

data:
  source: {source}
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
    module: trainyard_trainer.models.{name}
    params: {{hidden_units: [64, 32]}}
  ps: {{replicas: 1}}
  workers: {{replicas: 1}}
  steps: 300
  batch_size: 64
  learning_rate: 0.01

{evaluation(label)}"""


def evaluation(label: list[str]) -> str:
    """A starting evaluation section for the task the label lines say."""
    if any("task: regression" in line for line in label):
        return "evaluation:\n  metrics: [rmse, mae, r2, loss]\n  thresholds:\n    r2: {min: 0.0}\n"
    return "evaluation:\n  metrics: [accuracy, loss]\n  thresholds:\n    accuracy: {min: 0.5}\n"


def models_dir() -> Path:
    """The folder of the trainer's model modules (`images/trainer/trainyard_trainer/models/` in a checkout)."""
    spec = importlib.util.find_spec(MODELS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ScaffoldError(f"{MODELS_PACKAGE} is not installed here: run `make bootstrap` first")
    return Path(next(iter(spec.submodule_search_locations)))


def new_pipeline(name: str, sample: Path | None, label: str | None, *, pipelines: Path, dags: Path,
                 models: Path | None = None, volume: Path | None = None, force: bool = False) -> Written:
    """Write the three files (and the first partition); refuse to overwrite without `force`."""
    models = models or models_dir()
    if not NAME.match(name):
        raise ScaffoldError(f"{name!r} is not a pipeline name: lowercase letters, digits and '_' "
                            "(it is also a Python module name and an Airflow DAG id)")
    config, shim, model = pipelines / f"{name}.yaml", dags / f"{name}.py", models / f"{name}.py"
    existing = [str(p) for p in (config, shim, model) if p.exists()]
    if existing and not force:
        raise ScaffoldError(f"{', '.join(existing)} already exist(s); use --force to overwrite")
    source = f"{layout.DATASETS}/{name}"
    if sample is not None:
        if not sample.is_file():
            raise ScaffoldError(f"{sample}: no such file")
        if label is None:
            raise ScaffoldError("--label COLUMN is required with --from (which column is the class to predict?)")
        features, labels, notes, rows = infer(sample, label)  # the sample is read once
    else:
        features = ["    - {name: x_0, dtype: float}", "    - {name: x_1, dtype: float}"]
        labels = ["    name: label", "    classes: [0, 1]"]
        notes = ["no --from sample: the features are placeholders; edit data.features and data.label"]
        rows = 1
    from trainyard_contract.atomic import write_bytes

    write_bytes(config, config_text(name, features, labels, rows, source).encode())
    write_bytes(shim, (TEMPLATES / "dag_shim.py.tmpl").read_text().format(name=name).encode())
    write_bytes(model, (models / MODEL_TEMPLATE).read_text().format(name=name).encode())
    data = None
    if sample is not None and volume is not None:
        data = layout.dataset_dir(volume, name) / f"date={dt.date.today().isoformat()}" / "part-0.csv"
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
