"""Old spellings of config fields, still read: each is moved to its new place before validation, with a notice.

Trainyard 0.1 spelled a stage's image and resources four ways (`prep.image`, `training.chief`,
`deploy.client_image`, ...); every stage section now has one `runtime: {image, resources, env}`. A file (or
`_defaults.yaml`, or a profile) written the old way keeps working: each of its documents is rewritten before the
layers are merged, so an old key in one layer and a new one in another merge as they would if both were new,
and an error in a moved value still points at the line the user wrote. The same document giving both spellings of
one field is an error: nobody can tell which was meant.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from trainyard.config.yaml_source import Loc, SourceDocument

# old location -> new location (both two or three keys deep)
RENAMED: tuple[tuple[Loc, Loc], ...] = (
    (("prep", "image"), ("prep", "runtime", "image")),
    (("prep", "resources"), ("prep", "runtime", "resources")),
    (("training", "image"), ("training", "runtime", "image")),
    (("training", "chief"), ("training", "runtime", "resources")),
    (("evaluation", "image"), ("evaluation", "runtime", "image")),
    (("evaluation", "resources"), ("evaluation", "runtime", "resources")),
    (("deploy", "client_image"), ("deploy", "runtime", "image")),
    (("deploy", "client_resources"), ("deploy", "runtime", "resources")),
)


def dotted(loc: Loc) -> str:
    return ".".join(str(part) for part in loc)


class MigrationError(Exception):
    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def migrate(document: SourceDocument) -> tuple[SourceDocument, list[str]]:
    """`document` with every old spelling moved to its new place, and one `FILE:LINE:COL: field: ...` notice per
    move; the document itself when it has none (the parse-time path of an up-to-date file copies nothing).
    MigrationError when one field is given both ways."""
    found = [(old, new) for old, new in RENAMED
             if isinstance(document.data.get(old[0]), dict) and old[1] in document.data[old[0]]]
    if not found:
        return document, []
    data: dict[str, Any] = {**document.data}
    notices, conflicts = [], []
    for old, new in found:
        where = document.key_marks.get(old) or document.mark_for(old)
        section = data[old[0]] = {**data[old[0]]}
        runtime = section.get(new[1])
        if runtime is not None and not isinstance(runtime, dict):
            continue  # `runtime` itself is wrong: validation names it, and the old key beside it
        if isinstance(runtime, dict) and new[2] in runtime:
            conflicts.append(f"{where}: {dotted(old)}: also given as {dotted(new)}; keep "
                             f"{dotted(new)} and remove {dotted(old)}")
            continue
        runtime = section[new[1]] = {**runtime} if isinstance(runtime, dict) else {}
        runtime[new[2]] = section.pop(old[1])
        notices.append(f"{where}: {dotted(old)}: deprecated spelling, read as {dotted(new)}; "
                       f"write `{old[0]}: {{{new[1]}: {{{new[2]}: ...}}}}` instead")
    if conflicts:
        raise MigrationError(conflicts)
    return replace(document, data=data, moved=tuple((new, old) for old, new in found)), notices
