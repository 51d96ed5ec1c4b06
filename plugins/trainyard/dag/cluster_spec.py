"""TF_CONFIG for every replica of a training job, in the shape Kubeflow's TFJob writes. Pure functions.

`{"cluster": {"chief": [...], "ps": [...], "worker": [...]}, "task": {"type": "worker", "index": 0}}`.
On Kubernetes the hosts are `<job>-<role>-<i>.<job>.<namespace>.svc:<port>` (a headless Service named after the
job, and each pod's hostname/subdomain); on the local backend they are 127.0.0.1 ports chosen at launch.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

ROLES = ("chief", "ps", "worker")


@dataclass(frozen=True)
class Replicas:
    chief: int = 1
    ps: int = 0
    worker: int = 0

    def count(self, role: str) -> int:
        return {"chief": self.chief, "ps": self.ps, "worker": self.worker}[role]

    def tasks(self) -> list[tuple[str, int]]:
        """Every (role, index) of the job, chief first, then PS, then workers."""
        return [(role, i) for role in ROLES for i in range(self.count(role))]


def job_name(pipeline: str, run_key: str, max_length: int = 40) -> str:
    """A DNS-1123 label unique per run: short enough that `<job>-worker-NN` stays a valid pod hostname."""
    base = re.sub(r"[^a-z0-9-]+", "-", f"{pipeline}-{run_key}".lower()).strip("-")
    digest = hashlib.sha1(f"{pipeline}/{run_key}".encode()).hexdigest()[:8]
    return f"{base[: max_length - 9].strip('-')}-{digest}"


def kubernetes_hosts(job: str, namespace: str, port: int, replicas: Replicas) -> dict[str, list[str]]:
    return {
        role: [f"{job}-{role}-{i}.{job}.{namespace}.svc:{port}" for i in range(replicas.count(role))]
        for role in ROLES
        if replicas.count(role)
    }


def local_hosts(ports: dict[str, list[int]]) -> dict[str, list[str]]:
    return {role: [f"127.0.0.1:{p}" for p in role_ports] for role, role_ports in ports.items() if role_ports}


def tf_config(cluster: dict[str, list[str]], role: str, index: int) -> str:
    """The TF_CONFIG JSON of task (role, index) in `cluster`."""
    if role not in cluster or not 0 <= index < len(cluster[role]):
        raise ValueError(f"task {role}:{index} is not in the cluster {sorted(cluster)}")
    return json.dumps({"cluster": cluster, "task": {"type": role, "index": index}}, sort_keys=True)
