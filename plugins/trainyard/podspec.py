"""Pure builders: ContainerSpec -> `kubernetes.client.V1Pod`. No cluster, no kubeconfig, no I/O.

Every pod is hardened for the Pod Security Standards "restricted" profile (non-root, no privilege escalation,
all capabilities dropped, RuntimeDefault seccomp, read-only root filesystem with an emptyDir for scratch), mounts
the shared volume, and carries its identity in labels (`trainyard/pipeline`, `trainyard/run`, `trainyard/stage`,
`trainyard/role`, `trainyard/index`), never in its name.
"""

from __future__ import annotations

import hashlib
import re

from kubernetes.client import models as k8s

from trainyard.layout import run_key
from trainyard.schema import PipelineConfig, Resources
from trainyard.stages import XCOM_DIR, ContainerSpec, RunContext

VOLUME_NAME = "trainyard-data"
SCRATCH_NAME = "scratch"
SCRATCH_PATH = "/tmp"
RUN_AS_USER = 1000


def label_value(text: str) -> str:
    """A valid label value (≤ 63 chars of `[A-Za-z0-9._-]`, alphanumeric at both ends) that stays unique."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "-", text).strip("._-")
    if safe == text and len(safe) <= 63:
        return safe
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]
    return f"{safe[:54].strip('._-')}-{digest}".strip("-")


def dns_label(text: str, max_length: int = 63) -> str:
    """A DNS-1123 label (lowercase alphanumerics and '-') derived from `text`, unique by a hash suffix."""
    safe = re.sub(r"[^a-z0-9-]", "-", text.lower()).strip("-")
    safe = re.sub(r"-+", "-", safe)
    digest = hashlib.sha1(text.encode()).hexdigest()[:6]
    return f"{safe[: max_length - 7].strip('-')}-{digest}"


def pod_labels(config: PipelineConfig, run: RunContext, spec: ContainerSpec, index: int | None) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/managed-by": "trainyard",
        "trainyard/pipeline": label_value(config.name),
        "trainyard/run": label_value(run_key(run.run_id)),
        "trainyard/stage": spec.stage,
        "trainyard/role": spec.role,
    }
    if index is not None:
        labels["trainyard/index"] = str(index)
    labels.update(spec.labels)
    return labels


def resource_requirements(resources: Resources) -> k8s.V1ResourceRequirements:
    requests = {"cpu": resources.cpu, "memory": resources.memory}
    limits = {"memory": resources.memory_limit or resources.memory}
    if resources.cpu_limit:
        limits["cpu"] = resources.cpu_limit
    if resources.gpu:
        requests["nvidia.com/gpu"] = str(resources.gpu)
        limits["nvidia.com/gpu"] = str(resources.gpu)
    return k8s.V1ResourceRequirements(requests=requests, limits=limits)


def restricted_security_context() -> k8s.V1SecurityContext:
    return k8s.V1SecurityContext(
        run_as_non_root=True,
        run_as_user=RUN_AS_USER,
        allow_privilege_escalation=False,
        read_only_root_filesystem=True,
        capabilities=k8s.V1Capabilities(drop=["ALL"]),
        seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault"),
    )


def env_vars(config: PipelineConfig, spec: ContainerSpec) -> list[k8s.V1EnvVar]:
    """Plain values from the spec, then each configured Secret by reference (`secretKeyRef`), never inlined."""
    env = [k8s.V1EnvVar(name=name, value=value) for name, value in sorted(spec.env.items())]
    for ref in config.kubernetes.secrets:
        env.append(
            k8s.V1EnvVar(
                name=ref.env,
                value_from=k8s.V1EnvVarSource(secret_key_ref=k8s.V1SecretKeySelector(name=ref.secret, key=ref.key)),
            )
        )
    return env


def build_pod(
    config: PipelineConfig,
    run: RunContext,
    spec: ContainerSpec,
    *,
    name: str,
    index: int | None = None,
    node_selector: dict[str, str] | None = None,
    read_only_volume: bool = False,
    hostname: str | None = None,
    subdomain: str | None = None,
) -> k8s.V1Pod:
    """One pod for one container of a stage."""
    volume = config.kubernetes.volume
    container = k8s.V1Container(
        name=spec.role,
        image=spec.image,
        image_pull_policy="IfNotPresent",
        command=list(spec.command),
        args=list(spec.args),
        env=env_vars(config, spec),
        resources=resource_requirements(spec.resources),
        security_context=restricted_security_context(),
        volume_mounts=[
            k8s.V1VolumeMount(name=VOLUME_NAME, mount_path=volume.mount_path, read_only=read_only_volume),
            k8s.V1VolumeMount(name=SCRATCH_NAME, mount_path=SCRATCH_PATH),
            k8s.V1VolumeMount(name="xcom", mount_path=XCOM_DIR),
        ],
    )
    return k8s.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=k8s.V1ObjectMeta(
            name=name,
            namespace=config.kubernetes.namespace,
            labels=pod_labels(config, run, spec, index),
            annotations={"trainyard/run-id": run.run_id},
        ),
        spec=k8s.V1PodSpec(
            hostname=hostname,
            subdomain=subdomain,
            restart_policy="Never",
            service_account_name=config.kubernetes.service_account,
            automount_service_account_token=False,
            node_selector=dict(node_selector if node_selector is not None else config.kubernetes.node_pools.cpu)
            or None,
            image_pull_secrets=[k8s.V1LocalObjectReference(name=s) for s in config.kubernetes.image_pull_secrets]
            or None,
            security_context=k8s.V1PodSecurityContext(
                run_as_non_root=True,
                run_as_user=RUN_AS_USER,
                fs_group=RUN_AS_USER,
                seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault"),
            ),
            containers=[container],
            volumes=[
                k8s.V1Volume(
                    name=VOLUME_NAME,
                    persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
                        claim_name=volume.claim, read_only=read_only_volume
                    ),
                ),
                k8s.V1Volume(name=SCRATCH_NAME, empty_dir=k8s.V1EmptyDirVolumeSource()),
                k8s.V1Volume(name="xcom", empty_dir=k8s.V1EmptyDirVolumeSource()),
            ],
        ),
    )


def build_stage_pod(config: PipelineConfig, run: RunContext, spec: ContainerSpec) -> k8s.V1Pod:
    """The pod of a single-container CPU stage (validate, prepare, evaluate)."""
    name = dns_label(f"{config.name}-{spec.stage}-{run_key(run.run_id)}")
    return build_pod(config, run, spec, name=name)


def worker_node_selector(config: PipelineConfig) -> dict[str, str]:
    """The GPU pool plus the GPU tier picked by `training.gpu_tier`, else by `training.priority`."""
    k8s_config = config.kubernetes
    tier_name = config.training.gpu_tier or k8s_config.tier_by_priority.get(config.training.priority)
    tier = k8s_config.gpu_tiers.get(tier_name) if tier_name else None
    return {**k8s_config.node_pools.gpu, **(tier.node_selector if tier else {})}


def build_job_pods(config: PipelineConfig, run: RunContext, specs: list[ContainerSpec], job: str) -> list[k8s.V1Pod]:
    """One pod per replica, named `<job>-<role>-<i>` with hostname/subdomain so TF_CONFIG's DNS names resolve
    through the job's headless Service; GPU workers go to the GPU pool, chief and PS to CPU nodes."""
    pods = []
    for spec in specs:
        index = int(spec.labels["trainyard/index"])
        name = f"{job}-{spec.role}-{index}"
        selector = worker_node_selector(config) if spec.role == "worker" and spec.resources.gpu else None
        pods.append(build_pod(config, run, spec, name=name, index=index, node_selector=selector,
                              hostname=name, subdomain=job))
    return pods
