"""Load `pipelines_config/*.yaml` into `PipelineConfig`, with one `FILE:LINE:COL: field: message` line per error.

`_defaults.yaml` in the same folder (files starting with `_` are not pipelines) holds cluster-wide defaults
(namespace, volume, node pools, GPU tiers); each pipeline file is deep-merged over it, and an error in a value that
came from the defaults file points at that file.

`TRAINYARD_PROFILE=<name>` adds `_profile-<name>.yaml` from the same folder between the two: defaults for one kind
of cluster (the shipped `small` profile fits one node with 2 CPUs and no GPU), which a pipeline's own values still
override. The variable belongs where the DAGs are parsed and run (the Airflow scheduler, workers, the CLI).
"""

from __future__ import annotations

import difflib
import logging
import os
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from trainyard.config.migration import MigrationError, migrate
from trainyard.config.yaml_source import Loc, SourceDocument, YamlSourceError, load_yaml_file
from trainyard_contract.schema import UNION_TAGS, PipelineConfig

DEFAULTS_FILE = "_defaults.yaml"
PROFILE_ENV = "TRAINYARD_PROFILE"
CONFIG_SUFFIXES = (".yaml", ".yml")
log = logging.getLogger("trainyard")


class ConfigError(Exception):
    """One or more problems in config files; `lines` are `FILE:LINE:COL: field: message`, ready to print."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def display_path(path: Path) -> str:
    """A short name for error lines: relative to the working directory when inside it (no filesystem calls)."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` over `base`: mappings merge key by key, every other value (lists included) is replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _unwrap_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside Optional[...] / list[...] / dict[..., ...] annotations, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap_model(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, list, dict, tuple):
        for arg in typing.get_args(annotation):
            found = _unwrap_model(arg)
            if found is not None:
                return found
    return None


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The model class that owns the last element of `loc` (for "did you mean" on unknown keys)."""
    model: type[BaseModel] | None = PipelineConfig
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int) or part not in model.model_fields:
            continue  # list index or dict key: stay on the element model
        model = _unwrap_model(model.model_fields[part].annotation)
    return model


def _message(error: dict[str, Any]) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    loc: Loc = tuple(error["loc"])
    if kind == "extra_forbidden":
        owner = _model_at(loc[:-1])
        known = sorted(owner.model_fields) if owner else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else (f"; known fields: {', '.join(known)}" if known else "")
        return f"unknown field{hint}"
    if kind == "missing":
        return "required field is missing"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        symbol = {"greater_than_equal": "≥", "greater_than": ">", "less_than_equal": "≤", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()))
        return f"must be {symbol} {bound} (got {value!r})"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')} (got {value!r})"
    if kind == "string_pattern_mismatch":
        return f"{value!r} does not match the pattern {ctx.get('pattern')}"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    text = error["msg"]
    return f"{text[0].lower()}{text[1:]} (got {value!r})" if "input" in error else text


def _refine(error: dict[str, Any]) -> dict[str, Any]:
    """Move a model validator's "@sub.field: message" error onto that sub-field."""
    text = str((error.get("ctx") or {}).get("error", ""))
    if error["type"] != "value_error" or not text.startswith("@") or ": " not in text:
        return error
    path, message = text[1:].split(": ", 1)
    parts = tuple(int(part) if part.isdigit() else part for part in path.split("."))  # list items by index
    return {**error, "loc": (*error["loc"], *parts), "ctx": {"error": message}}


def _error_line(error: dict[str, Any], sources: Iterable[SourceDocument], fallback: SourceDocument) -> str:
    error = _refine(error)
    error = {**error, "loc": tuple(part for part in error["loc"] if part not in UNION_TAGS)}
    loc: Loc = tuple(error["loc"])
    dotted = ".".join(str(part) for part in loc) or "(top level)"
    mark = None
    for source in sources:
        mark = source.find(loc, key=error["type"] == "extra_forbidden")
        if mark is not None:
            break
    if mark is None:
        mark = fallback.mark_for(loc)
    return f"{mark}: {dotted}: {_message(error)}"


_defaults_cache: dict[tuple[str, int, int], SourceDocument] = {}


def profile_file(folder: Path) -> Path | None:
    """`_profile-<name>.yaml` for `TRAINYARD_PROFILE=<name>`; None when no profile is asked for."""
    name = os.environ.get(PROFILE_ENV, "").strip()
    if not name:
        return None
    path = folder / f"_profile-{name}.yaml"
    if not path.is_file():
        known = sorted(p.name[len("_profile-"):-len(".yaml")] for p in folder.glob("_profile-*.yaml"))
        raise ConfigError([f"{display_path(folder)}: {PROFILE_ENV}={name!r} but there is no {path.name} there "
                           f"(profiles: {', '.join(known) or 'none'}); unset it or add the file"])
    return path


def _cached_yaml(path: Path) -> SourceDocument | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _defaults_cache:
        _defaults_cache[key] = load_yaml_file(path, display_path(path))
    return _defaults_cache[key]


def load_defaults(folder: Path) -> list[SourceDocument]:
    """The folder's `_defaults.yaml`, then the `TRAINYARD_PROFILE` file if one is set (lowest first), each parsed
    once per process and file version (every DAG shim asks for them)."""
    paths = [folder / DEFAULTS_FILE, profile_file(folder)]
    return [doc for doc in (_cached_yaml(p) for p in paths if p is not None) if doc is not None]


def validate_document(
    document: SourceDocument, defaults: list[SourceDocument] | None, expected_name: str | None,
    notices: list[str] | None = None,
) -> PipelineConfig:
    """Validate one parsed pipeline (merged over the defaults, lowest first); raise ConfigError with every
    problem, each pointing at the file its value came from. Old spellings of fields are read (config_migration.py)
    and each adds a `FILE:LINE:COL: field: ...` line to `notices` (logged once per process when none is given)."""
    layers, said = [], []
    try:
        for layer in [*(defaults or []), document]:
            migrated, moved = migrate(layer)
            layers.append(migrated)
            said += moved
    except MigrationError as exc:
        raise ConfigError(exc.lines) from None
    if notices is not None:
        notices.extend(said)
    else:
        _log_once(said)
    document, defaults = layers[-1], layers[:-1]
    data: dict[str, Any] = {}
    for layer in layers:
        data = deep_merge(data, layer.data) if data else layer.data
    sources = [document, *reversed(defaults)]
    try:
        config = PipelineConfig.model_validate(data)
    except ValidationError as exc:
        lines = [_error_line(err, sources, document) for err in exc.errors(include_url=False)]
        raise ConfigError(lines) from None
    if expected_name is not None and config.name != expected_name:
        mark = document.mark_for(("name",))
        raise ConfigError(
            [f"{mark}: name: {config.name!r} must match the file name {expected_name!r} (one file, one DAG id)"]
        )
    return config


_logged: set[str] = set()


def _log_once(notices: list[str]) -> None:
    for line in notices:
        if line not in _logged:
            _logged.add(line)
            log.warning("%s", line)


def load_pipeline_file(path: Path, defaults: list[SourceDocument] | None = None,
                       notices: list[str] | None = None) -> PipelineConfig:
    """Load one pipeline config file; defaults come from `_defaults.yaml` (and the profile) beside it unless
    given."""
    try:
        if defaults is None:
            defaults = load_defaults(path.parent)
        document = load_yaml_file(path, display_path(path))
    except YamlSourceError as exc:
        raise ConfigError(exc.lines) from None
    return validate_document(document, defaults, expected_name=path.stem, notices=notices)


def pipeline_files(folder: Path) -> list[Path]:
    """Every pipeline config in `folder` (not `_`-prefixed), sorted."""
    return sorted(
        p for p in folder.iterdir() if p.suffix in CONFIG_SUFFIXES and not p.name.startswith("_") and p.is_file()
    )


def find_pipeline_file(folder: Path, name: str) -> Path:
    """The one config file for pipeline `name` (`<name>.yaml` or `<name>.yml`, not both)."""
    candidates = [folder / f"{name}{suffix}" for suffix in CONFIG_SUFFIXES if (folder / f"{name}{suffix}").is_file()]
    if not candidates:
        known = [p.stem for p in pipeline_files(folder)] if folder.is_dir() else []
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; pipelines there: {', '.join(known) or 'none'}"
        raise ConfigError([f"{display_path(folder)}: no pipeline config named {name!r}{hint}"])
    if len(candidates) > 1:
        raise ConfigError(
            [f"{display_path(candidates[1])}:1:1: name: pipeline {name!r} is defined twice "
             f"(also {display_path(candidates[0])}); keep one file per pipeline"]
        )
    return candidates[0]


def check_folder(paths: list[Path], notices: list[str] | None = None) -> tuple[list[PipelineConfig], list[str]]:
    """Validate several files (as `trainyard check` does): every valid config and every error line; deprecated
    spellings go to `notices`, each line once."""
    configs: list[PipelineConfig] = []
    errors: list[str] = []
    seen: dict[str, Path] = {}
    defaults_cache: dict[Path, list[SourceDocument]] = {}
    for path in paths:
        try:
            folder = path.parent.resolve()
            if folder not in defaults_cache:
                defaults_cache[folder] = load_defaults(path.parent)
            said: list[str] = []
            config = load_pipeline_file(path, defaults_cache[folder], said)
            if notices is not None:
                notices.extend(line for line in said if line not in notices)
        except ConfigError as exc:
            errors.extend(exc.lines)
            continue
        except YamlSourceError as exc:
            errors.extend(exc.lines)
            continue
        if config.name in seen:
            errors.append(
                f"{display_path(path)}:1:1: name: pipeline {config.name!r} is defined twice "
                f"(also {display_path(seen[config.name])}); DAG ids must be unique"
            )
            continue
        seen[config.name] = path
        configs.append(config)
    return configs, errors
