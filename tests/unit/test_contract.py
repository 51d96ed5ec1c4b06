"""The stage contract stands alone, and each stage image needs only the contract and its own dependencies.

Each check runs in a fresh interpreter in which the modules an image would not have cannot be imported: the
Airflow side (`airflow`, `kubernetes`, the `trainyard` plugin package), the other images' packages, and the heavy
libraries its Dockerfile does not install. Every module of the image's package is then imported, so a stray
`from trainyard.x import y` or a missing pip line fails here instead of in a pod.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_SIDE = {"airflow", "kubernetes", "trainyard"}
IMAGE_PACKAGES = {"trainyard_prep", "trainyard_trainer", "trainyard_serving"}
# import name -> the distribution (pip line or base image) that brings it
HEAVY = {"tensorflow": "tensorflow", "keras": "tensorflow", "great_expectations": "great-expectations",
         "pandas": "pandas", "tensorflow_serving": "tensorflow-serving-api", "sklearn": "scikit-learn",
         "tensorboard": "tensorboard", "yaml": "pyyaml", "pyarrow": "pyarrow",
         "google_crc32c": "google-crc32c"}
BASE_IMAGES = {"tensorflow/tensorflow": {"tensorflow"}, "python": set()}

IMPORT_ALL = r"""
import importlib, importlib.abc, json, pkgutil, sys
blocked, packages = set(json.loads(sys.argv[1])), json.loads(sys.argv[2])

class NotInThisImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (not in this image)", name=name)
        return None

sys.meta_path.insert(0, NotInThisImage())
sys.path = [p for p in sys.path if not p.rstrip("/").endswith("plugins")]
imported = []
for package in packages:
    module = importlib.import_module(package)
    imported.append(package)
    for info in pkgutil.walk_packages(getattr(module, "__path__", []), package + "."):
        importlib.import_module(info.name)
        imported.append(info.name)
print(json.dumps(imported))
"""


def image_needs(dockerfile: Path) -> tuple[list[str], set[str]]:
    """(the image's own packages, the distributions it has), read from its Dockerfile."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    packages = re.findall(r"^COPY \S+/(trainyard_\w+) ", text, re.M)
    have: set[str] = set()
    for base in re.findall(r"^FROM ([\w./-]+):", text, re.M):
        have |= BASE_IMAGES[base]
    for line in re.findall(r"^RUN pip install (.*)$", text, re.M):
        have |= {re.split(r"[=<>\[]", word)[0] for word in line.split() if not word.startswith(("-", "/"))}
    return packages, have


def import_everything(packages: list[str], blocked: set[str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL, json.dumps(sorted(blocked)), json.dumps(packages)],
                          capture_output=True, text=True, timeout=300, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_contract_needs_nothing_but_pydantic() -> None:
    blocked = AIRFLOW_SIDE | IMAGE_PACKAGES | set(HEAVY) | {"numpy"}
    imported = import_everything(["trainyard_contract"], blocked)
    assert {"trainyard_contract.schema", "trainyard_contract.layout", "trainyard_contract.runtime",
            "trainyard_contract.atomic", "trainyard_contract.tf_config", "trainyard_contract.artifacts",
            "trainyard_contract.metrics"} <= set(imported)


def test_the_check_catches_a_module_the_image_does_not_have() -> None:
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL, json.dumps(["trainyard"]), json.dumps(["json"])],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    blocked = subprocess.run([sys.executable, "-c", IMPORT_ALL, json.dumps(["trainyard"]),
                              json.dumps(["trainyard.dag.registry"])], capture_output=True, text=True, timeout=60)
    assert blocked.returncode != 0 and "(not in this image)" in blocked.stderr


@pytest.mark.parametrize("image", ["prep", "trainer", "evaluate", "serving", "stream"])
def test_each_image_needs_only_the_contract_and_its_own_dependencies(image: str) -> None:
    dockerfile = REPO / "images" / image / "Dockerfile"
    packages, have = image_needs(dockerfile)
    assert packages, f"{dockerfile} copies no stage package"
    text = dockerfile.read_text()
    assert "plugins/" not in text, f"{dockerfile} copies from plugins/: install the contract package instead"
    assert re.search(r"^RUN pip install .*/contract", text, re.M), f"{dockerfile} does not install the contract"
    blocked = AIRFLOW_SIDE | (IMAGE_PACKAGES - set(packages)) | {name for name, dist in HEAVY.items()
                                                                 if dist not in have}
    imported = import_everything(packages, blocked)
    assert f"{packages[0]}.__main__" in imported


def test_the_contract_builds_as_a_package_of_its_own(tmp_path: Path) -> None:
    """What each Dockerfile does (`pip install contract/`): a wheel holding the contract's modules and nothing else."""
    import shutil
    import zipfile

    source = tmp_path / "contract"  # a copy: building in place would leave build/ in the checkout
    shutil.copytree(REPO / "contract", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("trainyard_contract-*.whl")
    modules = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}
    expected = {f"trainyard_contract/{p.name}" for p in (REPO / "contract" / "trainyard_contract").glob("*.py")}
    assert modules == expected and len(expected) == 10
