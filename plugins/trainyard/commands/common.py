"""What every `trainyard` command shares: exit codes and loading a pipeline's config by name."""

from __future__ import annotations

import sys
from pathlib import Path

from trainyard import settings
from trainyard.config.loader import ConfigError, find_pipeline_file, load_pipeline_file
from trainyard_contract.schema import PipelineConfig

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C


def load_named(name: str) -> tuple[PipelineConfig, Path] | None:
    """The config of pipeline `name` from the pipelines folder and its path, or None after printing the errors."""
    try:
        path = find_pipeline_file(settings.pipelines_dir(), name)
        return load_pipeline_file(path), path
    except ConfigError as exc:
        print("\n".join(exc.lines), file=sys.stderr)
        return None
