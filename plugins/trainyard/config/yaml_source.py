"""YAML loading that remembers where every value came from, so config errors can name FILE:LINE:COL."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

Loc = tuple[str | int, ...]
# libyaml's safe loader when PyYAML was built with it (the PyPI wheels are): same safe semantics, same marks,
# several times faster than the pure-Python scanner, which matters because every DAG shim parses at parse time.
SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Mark:
    """A 1-based position in a source file."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True)
class SourceDocument:
    """A parsed YAML mapping plus, computed on first use, the position of every key and value by location.

    Positions are only needed to report errors, so a valid file (the parse-time hot path) never builds them.
    """

    file: str
    data: dict[str, Any]
    node: yaml.Node = field(repr=False, compare=False)
    moved: tuple[tuple[Loc, Loc], ...] = ()  # (where `data` has it, where the file has it): config_migration.py

    @cached_property
    def _positions(self) -> tuple[dict[Loc, Mark], dict[Loc, Mark]]:
        marks: dict[Loc, Mark] = {(): _mark(self.file, self.node)}
        key_marks: dict[Loc, Mark] = {}
        _walk(self.file, self.node, (), marks, key_marks, [])
        return marks, key_marks

    @property
    def marks(self) -> dict[Loc, Mark]:
        """Where each value starts."""
        return self._positions[0]

    @property
    def key_marks(self) -> dict[Loc, Mark]:
        """Where each mapping key starts (for "unknown field" errors)."""
        return self._positions[1]

    def in_file(self, loc: Loc) -> Loc:
        """Where `loc` of `data` is written in the file (an old spelling that was moved is found where it is)."""
        for now, then in self.moved:
            if loc[:len(now)] == now:
                return then + loc[len(now):]
        return loc

    def find(self, loc: Loc, key: bool = False) -> Mark | None:
        """The position of `loc` of `data` (of its key, with `key`), or None when the file does not give it."""
        return (self.key_marks if key else self.marks).get(self.in_file(loc))

    def mark_for(self, loc: Loc) -> Mark | None:
        """The position of `loc`, or of its nearest ancestor present in the file."""
        loc = self.in_file(loc)
        for end in range(len(loc), -1, -1):
            mark = self.marks.get(tuple(loc[:end]))
            if mark is not None:
                return mark
        return None


class YamlSourceError(Exception):
    """A file that is not valid YAML or not a mapping; `lines` are ready to print."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def _mark(file: str, node: yaml.Node) -> Mark:
    return Mark(file, node.start_mark.line + 1, node.start_mark.column + 1)


def _walk(file: str, node: yaml.Node, loc: Loc, marks: dict[Loc, Mark], key_marks: dict[Loc, Mark],
          errors: list[str]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, Mark] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            here = _mark(file, key_node)
            if key in seen:
                dotted = ".".join(str(p) for p in (*loc, key))
                errors.append(f"{here}: {dotted}: duplicate key (first defined at line {seen[key].line})")
            seen[key] = here
            child = (*loc, key)
            key_marks[child] = here
            marks[child] = _mark(file, value_node) if isinstance(value_node, yaml.ScalarNode) else here
            _walk(file, value_node, child, marks, key_marks, errors)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = (*loc, index)
            marks[child] = _mark(file, item)
            _walk(file, item, child, marks, key_marks, errors)


def parse_yaml(text: str, file: str) -> SourceDocument:
    """Parse one YAML document with the safe loader and record the position of every node."""
    loader = SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise YamlSourceError([f"{file}:1:1: the file is empty; a pipeline config is a YAML mapping"])
        if not isinstance(node, yaml.MappingNode):
            raise YamlSourceError([f"{_mark(file, node)}: the top level must be a mapping of fields"])
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else f"{file}:1:1"
        problem = exc.problem or exc.context or "invalid YAML"
        raise YamlSourceError([f"{where}: YAML syntax error: {problem}"]) from None
    finally:
        loader.dispose()
    if _has_duplicate_keys(node):
        errors: list[str] = []
        _walk(file, node, (), {}, {}, errors)
        raise YamlSourceError(errors)
    return SourceDocument(file=file, data=data, node=node)


def _has_duplicate_keys(node: yaml.Node) -> bool:
    """Safe-loading keeps the last of two equal keys silently; a config must not."""
    if isinstance(node, yaml.MappingNode):
        keys = [k.value for k, _ in node.value]
        return len(keys) != len(set(map(str, keys))) or any(_has_duplicate_keys(v) for _, v in node.value)
    if isinstance(node, yaml.SequenceNode):
        return any(_has_duplicate_keys(item) for item in node.value)
    return False


def load_yaml_file(path: Path, display: str | None = None) -> SourceDocument:
    """Read and parse `path`; `display` is the name used in error lines (a path relative to the repo)."""
    name = display or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise YamlSourceError([f"{name}:1:1: cannot read the file: {exc.strerror}"]) from None
    except UnicodeDecodeError:
        raise YamlSourceError([f"{name}:1:1: the file is not UTF-8 text"]) from None
    return parse_yaml(text, name)
