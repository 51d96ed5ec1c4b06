"""The shared-volume layout: the contract between stages (DESIGN.md, "Volume layout"). Pure names and paths.

Every file or folder one stage writes and another reads has one name here, as an `Artifact`. An artifact is a path
relative to the run folder and works wherever a path does: `run_dir / METRICS` is `<run>/eval/metrics.json`.
Writers that stage a whole run sub-folder (`staged_dir(run_dir / EVAL)`) put a file in it by its `name`:
`out / METRICS.name`. `tests/unit/test_layout.py` fails when a run-folder name is spelled anywhere else.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

RUNS, MODELS, DATASETS = "runs", "models", "datasets"


@dataclass(frozen=True)
class Artifact:
    """A file or folder of a run folder: `folder` is the run sub-folder, `name` the entry in it ("" = the folder)."""

    folder: str
    name: str = ""
    description: str = ""

    @property
    def relpath(self) -> str:
        return f"{self.folder}/{self.name}" if self.name else self.folder

    def __fspath__(self) -> str:
        return self.relpath

    def __str__(self) -> str:
        return self.relpath


# -- run sub-folders, in the order the stages fill them -----------------------------------------------------------
INPUTS = Artifact("inputs", description="the pinned input partitions (snapshots) and their manifest")
VALIDATION = Artifact("validation", description="Great Expectations results and Data Docs")
PREPARED = Artifact("prepared", description="TFRecord shards by split, schema, statistics, manifest")
CLUSTER = Artifact("cluster", description="the training job's replica logs")
CHECKPOINTS = Artifact("checkpoints", description="training checkpoints (resume on retry)")
MODEL = Artifact("model", description="the exported SavedModel and its training record")
TENSORBOARD = Artifact("tensorboard", description="TensorBoard event files")
EVAL = Artifact("eval", description="metrics, smoke set and report")
DEPLOY = Artifact("deploy", description="the decision and the deploy result")
PARTS = Artifact("parts", description="each file group's validate / prepare output, joined by merge_data "
                 "(prep.parallelism above 1; a single-pod run stages its one group here too)")

# -- files and folders inside them --------------------------------------------------------------------------------
INPUTS_MANIFEST = Artifact("inputs", "manifest.json", "the pinned partitions: paths, sizes, sha256, window")
INPUT_GROUPS = Artifact("inputs", "groups.json", "the pinned files cut into groups, one per mapped data task")
VALIDATION_PARTS = Artifact("parts", "validate", "each group's GE results and file reports (merge_data joins them)")
PREPARED_PARTS = Artifact("parts", "prepare", "each group's shard parts and partial statistics")
VALIDATION_RESULTS = Artifact("validation", "results.json", "per-expectation results of the suite")
DATA_DOCS = Artifact("validation", "data_docs", "the Great Expectations Data Docs site")
DATA_DOCS_INDEX = Artifact("validation", "data_docs/index.html", "the Data Docs entry page")
PREPARED_SCHEMA = Artifact("prepared", "schema.json", "features, dtypes and label of the shards")
PREPARED_STATS = Artifact("prepared", "stats.json", "per-feature statistics of the train split")
PREPARED_MANIFEST = Artifact("prepared", "manifest.json", "shards, row counts, split, input hashes")
CLUSTER_LOGS = Artifact("cluster", "logs", "one log file per PS/worker replica (local backend)")
TENSORBOARD_TRAIN = Artifact("tensorboard", "train", "training-loss event files")
SAVED_MODEL = Artifact("model", "saved_model", "the exported SavedModel (serving_default signature)")
MODEL_SCHEMA = Artifact("model", "schema.json", "the schema the model was trained on")
TRAINING_RECORD = Artifact("model", "training.json", "strategy, steps, loss, resumed step, TF version")
METRICS = Artifact("eval", "metrics.json", "challenger and champion metrics on the eval split")
SMOKE_SET = Artifact("eval", "smoke.json", "a few eval rows with the evaluator's predictions (deploy checks them)")
REPORT = Artifact("eval", "report.html", "the evaluation report with plots")
DECISION = Artifact("deploy", "decision.json", "deploy or skip, with reasons (the deploy stage's blessing)")
DEPLOY_RESULT = Artifact("deploy", "result.json", "the published version, or the rollback")

# collected, not kept by hand: an artifact declared above is in these (the spelling guard and the DAG docs use them)
RUN_SUBDIRS = tuple(a.folder for a in list(globals().values()) if isinstance(a, Artifact) and not a.name)
RUN_ARTIFACTS = tuple(a for a in list(globals().values()) if isinstance(a, Artifact) and a.name)

# -- a published model version: models/<model_name>/<version>/ (TF Serving's model_base_path) -------------------
VERSION_METADATA = "trainyard.json"  # lineage of a published version, beside the SavedModel's files
SAVED_MODEL_PB = "saved_model.pb"  # TensorFlow's own file name: a folder without it is no SavedModel
PUBLISHED_NAMES = (VERSION_METADATA, SAVED_MODEL_PB)


def shard_name(index: int, count: int) -> str:
    """The file name of TFRecord shard `index` of `count` in `prepared/<split>/`."""
    return f"part-{index:05d}-of-{count:05d}.tfrecord"


SHARD_GLOB = "*.tfrecord"


def group_name(index: int) -> str:
    """The folder of file group `index` under `parts/validate/` and `parts/prepare/`."""
    return f"group-{index:05d}"


def run_key(run_id: str) -> str:
    """A folder-safe, unique name for an Airflow run id.

    Characters outside `[A-Za-z0-9._-]` become `-`; when anything was replaced a short hash of the original
    run id is appended, so two run ids that sanitise alike (`a:b`, `a+b`) never share a folder.
    """
    if not run_id:
        raise ValueError("run_id is empty")
    safe = re.sub(r"[^A-Za-z0-9._-]", "-", run_id).strip(".-") or "run"
    if safe != run_id:
        safe = f"{safe[:80]}-{hashlib.sha1(run_id.encode()).hexdigest()[:6]}"
    return safe


def volume_root(root: str | PurePosixPath) -> PurePosixPath:
    """A volume root for `RunLayout`: a mount path given as text becomes a `PurePosixPath` (a pod's, never touched
    here); a local folder given as a `Path` stays one (a `PosixPath` is a `PurePosixPath`), so the local backend can
    create and open the paths it gets."""
    return root if isinstance(root, PurePosixPath) else PurePosixPath(root)


@dataclass(frozen=True)
class RunLayout:
    """Paths of one run, relative to a volume root (`/data` in a pod, a local folder on the local backend)."""

    root: PurePosixPath
    pipeline: str
    key: str

    @classmethod
    def for_run(cls, root: str | PurePosixPath, pipeline: str, run_id: str) -> RunLayout:
        return cls(volume_root(root), pipeline, run_key(run_id))

    @property
    def run_dir(self) -> PurePosixPath:
        return runs_dir(self.root, self.pipeline) / self.key

    def path(self, artifact: Artifact) -> PurePosixPath:
        return self.run_dir / artifact


def runs_dir(root: PurePosixPath | Path, pipeline: str) -> PurePosixPath | Path:
    """`runs/<pipeline>/`: one folder per run below it."""
    return root / RUNS / pipeline


def models_dir(root: PurePosixPath | Path, model_name: str) -> PurePosixPath | Path:
    """`models/<model_name>/`: TF Serving's model_base_path, integer version folders below it."""
    return root / MODELS / model_name


def dataset_dir(root: PurePosixPath | Path, dataset: str) -> PurePosixPath | Path:
    """`datasets/<dataset>/`: raw input partitions."""
    return root / DATASETS / dataset


def published_versions(model_dir: Path) -> list[int]:
    """The integer version folders under `models/<name>/`, ascending; temporary and removed ones are hidden."""
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if p.name.isdigit())
