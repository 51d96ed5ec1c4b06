"""The Airflow side's folders follow the flow: config -> dag -> launch -> commands. A module imports, at its top,
only from its own folder or one before it (DESIGN.md, "Packages"); reaching forward is done inside a function, when
a task runs, never at parse time."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "plugins" / "trainyard"
ORDER = ["config", "dag", "launch", "commands"]


def top_level_imports(path: Path) -> list[str]:
    """The `trainyard.*` modules a file imports at module level (not in functions, not under TYPE_CHECKING)."""
    names = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainyard."):
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(a.name for a in node.names if a.name.startswith("trainyard."))
    return names


def forward_imports(root: Path = PACKAGE) -> list[str]:
    found = []
    for rank, folder in enumerate(ORDER):
        for path in sorted((root / folder).rglob("*.py")):
            for module in top_level_imports(path):
                target = module.split(".")[1]
                if target in ORDER and ORDER.index(target) > rank:
                    found.append(f"{path.relative_to(root)} imports {module}")
    return found


def test_no_folder_imports_a_later_one_at_its_top() -> None:
    assert forward_imports() == []


def test_a_forward_import_is_found(tmp_path: Path) -> None:
    for folder in ORDER:
        (tmp_path / folder).mkdir()
    (tmp_path / "config" / "loader.py").write_text("from trainyard.dag.registry import STAGES\n")
    (tmp_path / "dag" / "ok.py").write_text("from trainyard.config.loader import x\n\ndef f():\n"
                                            "    from trainyard.launch import launcher_for\n")
    assert forward_imports(tmp_path) == ["config/loader.py imports trainyard.dag.registry"]
