"""An event's JSON checked against the pipeline's features (and, for landing, its label), before anything else
sees it: a record that is not JSON, lacks a feature or has the wrong type is refused here with a reason a producer
can act on, and the good records of the same batch go on.

The scorer checks types only: a value the model has not seen (a new category, an out-of-range number) is the
model's to answer, as over REST. The lander also applies the config's `min`/`max`/`allowed` and the label's
classes, because prepare's validation would refuse the whole partition for one such row.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import orjson

from trainyard_contract.schema import Feature, Label, PipelineConfig

EVENT_FIELD = "data"  # the entry field that holds the event's JSON object
MISSING = object()


class Refused(ValueError):
    """Why an event cannot be used (it goes to the dead-letter stream with this reason)."""


@dataclass(frozen=True)
class Event:
    key: str
    values: dict[str, Any]  # feature (and label) values by served name, None for a missing nullable value


def decode(fields: dict[str, str], key_field: str) -> tuple[dict[str, Any], str]:
    """The entry's JSON object and its key; Refused names what is wrong."""
    raw = fields.get(EVENT_FIELD)
    if raw is None:
        raise Refused(f"the entry has no {EVENT_FIELD!r} field (the event's JSON object); fields: "
                      f"{sorted(fields)[:10]}")
    try:
        record = orjson.loads(raw)  # strict JSON: NaN and Infinity are not JSON numbers
    except orjson.JSONDecodeError as exc:
        raise Refused(f"not JSON: {exc}") from None
    if not isinstance(record, dict):
        raise Refused(f"not a JSON object but {type(record).__name__}")
    key = record.get(key_field)
    if key is None or isinstance(key, (bool, dict, list)) or key == "":
        raise Refused(f"no key: the event needs a {key_field!r} field (a string or a number)")
    return record, str(key)


def key_of(fields: dict[str, str], key_field: str) -> str:
    """The key for a dead letter, when the event got far enough to have one."""
    try:
        return decode(fields, key_field)[1]
    except Refused:
        return ""


def check_value(feature: Feature, value: Any, ranges: bool) -> Any:
    """The value as the served signature or the data files take it; Refused when it cannot be."""
    name = feature.name
    if value is None:
        if feature.nullable:
            return None
        raise Refused(f"feature {name!r} is null and the feature is not nullable")
    if feature.dtype == "string":
        if not isinstance(value, str):
            raise Refused(f"feature {name!r} must be text (string), got {json.dumps(value)[:40]}")
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Refused(f"feature {name!r} must be a number ({feature.dtype}), got {json.dumps(value)[:40]}")
    elif feature.dtype == "int" and not isinstance(value, int):
        if not (isinstance(value, float) and value.is_integer()):
            raise Refused(f"feature {name!r} must be an integer, got {value!r}")
        value = int(value)
    elif not math.isfinite(value):
        raise Refused(f"feature {name!r} must be finite, got {value!r}")
    if ranges:
        check_range(feature, value)
    return value


def check_range(feature: Feature, value: Any) -> None:
    if feature.allowed is not None and value not in feature.allowed:
        raise Refused(f"feature {feature.name!r}: {value!r} is not one of the allowed values {feature.allowed[:10]}")
    if feature.min is not None and value < feature.min:
        raise Refused(f"feature {feature.name!r}: {value!r} is below its min {feature.min:g}")
    if feature.max is not None and value > feature.max:
        raise Refused(f"feature {feature.name!r}: {value!r} is above its max {feature.max:g}")


def check_label(label: Label, value: Any) -> Any:
    if value is None:
        raise Refused(f"label {label.name!r} is missing: landed events must be labelled")
    if label.task == "classification":
        if label.dtype == "int" and isinstance(value, float) and value.is_integer():
            value = int(value)  # 1.0 is class 1: the files store an int label
        if isinstance(value, bool) or type(value) is not type((label.classes or [""])[0]) or \
                value not in (label.classes or []):
            raise Refused(f"label {label.name!r}: {value!r} is not one of the classes {label.classes}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Refused(f"label {label.name!r} must be a finite number, got {json.dumps(value)[:40]}")
    if label.min is not None and value < label.min or label.max is not None and value > label.max:
        raise Refused(f"label {label.name!r}: {value!r} is outside [{label.min}, {label.max}]")
    return float(value) if label.dtype == "float" else value


def dead_letter(stream: str, source: str, entry_id: str, fields: dict[str, str], key: str,
                reason: str) -> tuple[str, dict[str, str]]:
    """The dead-letter entry of an event: its key, the reason, where it came from and the event as it was."""
    return (stream, {"key": key, "reason": reason, "source": source, "source_id": entry_id,
                     EVENT_FIELD: fields.get(EVENT_FIELD, json.dumps(fields))})


class EventSchema:
    """The pipeline's feature columns (and label) that an event must carry."""

    def __init__(self, config: PipelineConfig, key_field: str, labelled: bool):
        self.columns = config.data.columns()
        types = {"float": float, "int": int, "string": str}
        self.fast = [(feature, types[feature.dtype]) for feature in self.columns]
        self.label = config.data.label if labelled else None
        self.key_field = key_field

    def parse(self, fields: dict[str, str]) -> Event:
        record, key = decode(fields, self.key_field)
        values: dict[str, Any] = {}
        ranges = self.label is not None
        for feature, plain_type in self.fast:
            name = feature.name
            value = record.get(name, MISSING)
            # the common case in one type test (a float must also be finite); anything else gets the full check
            if type(value) is plain_type and not ranges and (plain_type is not float or math.isfinite(value)):
                values[name] = value
                continue
            if value is MISSING:
                raise Refused(f"feature {name!r} is missing")
            values[name] = check_value(feature, value, ranges)
        if self.label is not None:
            values[self.label.name] = check_label(self.label, record.get(self.label.name))
        return Event(key, values)
