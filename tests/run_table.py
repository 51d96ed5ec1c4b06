"""Reads the task table `trainyard run` ends with (trainyard/run_summary.py) back into values, for the tests."""

from __future__ import annotations

import re

ROW = re.compile(r"^trainyard run: (?P<task>[a-z_]+(?: \[\d+\])?)\s+(?P<state>[a-z_]+(?: run)?)\s+"
                 r"(?P<wall>\d+\.\ds|-)\s+(?P<retries>\d+|-)(?:\s+(?P<note>.*))?$")


def task_table(output: str) -> dict[str, dict]:
    """{task: {state, seconds (None: did not run), retries (None), note}} from a `trainyard run` output."""
    rows = {}
    for line in output.splitlines():
        match = ROW.match(line)
        if match and match["task"] != "task":
            wall = match["wall"]
            rows[match["task"]] = {"state": match["state"], "seconds": None if wall == "-" else float(wall[:-1]),
                                   "retries": None if match["retries"] == "-" else int(match["retries"]),
                                   "note": match["note"] or ""}
    return rows


def stage_times(output: str) -> dict[str, float]:
    """{task: seconds} of the tasks that ran."""
    return {task: row["seconds"] for task, row in task_table(output).items() if row["seconds"] is not None}
