"""Pure builders: ContainerSpec -> `kubernetes.client.V1Pod`. No cluster, no kubeconfig, no I/O.

Every pod is hardened for the Pod Security Standards "restricted" profile (non-root, no privilege escalation,
all capabilities dropped, RuntimeDefault seccomp, read-only root filesystem with an emptyDir for scratch), mounts
the shared volume, and carries its identity in labels (`trainyard/pipeline`, `trainyard/run`, `trainyard/stage`,
`trainyard/role`, `trainyard/index`), never in its name.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import PurePosixPath

from kubernetes.client import models as k8s

from trainyard.dag.registry import Stage
from trainyard.dag.stages import ContainerSpec, RunContext
from trainyard_contract.layout import models_dir
from trainyard_contract.runtime import XCOM_DIR
from trainyard_contract.schema import GpuTier, PipelineConfig, Resources

VOLUME_NAME = "trainyard-data"
SCRATCH_NAME = "scratch"
SCRATCH_PATH = "/tmp"
RUN_AS_USER = 1000
PLACEMENT_ANNOTATION = "trainyard.io/placement"  # which nodes a pod needs, in words (quoted while it is Pending)


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


def pod_labels(config: PipelineConfig, run: RunContext, spec: ContainerSpec) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/managed-by": "trainyard",
        "trainyard/pipeline": label_value(config.name),
        "trainyard/run": label_value(run.key),
        "trainyard/stage": spec.stage,
        "trainyard/role": spec.role,
    }
    if spec.index is not None:
        labels["trainyard/index"] = str(spec.index)
    return labels


def job_selector(config: PipelineConfig, run: RunContext, stage: Stage) -> dict[str, str]:
    """The labels every replica pod of a run's training job carries (the headless Service selects on them)."""
    return {"trainyard/pipeline": label_value(config.name), "trainyard/run": label_value(run.key),
            "trainyard/stage": stage.name}


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


def restricted_pod_security_context() -> k8s.V1PodSecurityContext:
    return k8s.V1PodSecurityContext(
        run_as_non_root=True,
        run_as_user=RUN_AS_USER,
        fs_group=RUN_AS_USER,
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
    node_selector: dict[str, str] | None = None,
    read_only_volume: bool = False,
    hostname: str | None = None,
    subdomain: str | None = None,
    priority_class: str | None = None,
    tolerations: list[dict[str, str]] | None = None,
    active_deadline_seconds: int | None = None,
    placement: str | None = None,
) -> k8s.V1Pod:
    """One pod for one container of a stage; `placement` says in words which nodes it needs (its
    `trainyard.io/placement` annotation, quoted when the pod cannot be scheduled)."""
    return k8s.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=k8s.V1ObjectMeta(
            name=name,
            namespace=config.kubernetes.namespace,
            labels=pod_labels(config, run, spec),
            annotations={"trainyard/run-id": run.run_id,
                         **({PLACEMENT_ANNOTATION: placement} if placement else {})},
        ),
        spec=k8s.V1PodSpec(
            hostname=hostname,
            subdomain=subdomain,
            priority_class_name=priority_class,
            active_deadline_seconds=active_deadline_seconds,
            tolerations=[k8s.V1Toleration(**t) for t in tolerations] if tolerations else None,
            restart_policy="Never",
            service_account_name=config.kubernetes.service_account,
            automount_service_account_token=False,
            node_selector=dict(node_selector if node_selector is not None else config.kubernetes.node_pools.cpu)
            or None,
            image_pull_secrets=[k8s.V1LocalObjectReference(name=s) for s in config.kubernetes.image_pull_secrets]
            or None,
            security_context=restricted_pod_security_context(),
            containers=[stage_container_object(config, spec, read_only_volume)],
            volumes=stage_volumes(config, read_only_volume),
        ),
    )


def stage_container_object(config: PipelineConfig, spec: ContainerSpec, read_only_volume: bool) -> k8s.V1Container:
    """The pod's one container: the spec's image, command, env and resources, hardened, with the shared volume,
    scratch and xcom mounted."""
    return k8s.V1Container(
        name=spec.role,
        image=spec.image,
        image_pull_policy="IfNotPresent",
        command=list(spec.command),
        args=list(spec.args),
        env=env_vars(config, spec),
        resources=resource_requirements(spec.resources),
        security_context=restricted_security_context(),
        volume_mounts=[
            k8s.V1VolumeMount(name=VOLUME_NAME, mount_path=config.kubernetes.volume.mount_path,
                              read_only=read_only_volume),
            k8s.V1VolumeMount(name=SCRATCH_NAME, mount_path=SCRATCH_PATH),
            k8s.V1VolumeMount(name="xcom", mount_path=XCOM_DIR),
        ],
    )


def stage_volumes(config: PipelineConfig, read_only_volume: bool) -> list[k8s.V1Volume]:
    """The shared PVC (read-only where the stage only reads), and the scratch and xcom emptyDirs."""
    claim = k8s.V1PersistentVolumeClaimVolumeSource(claim_name=config.kubernetes.volume.claim,
                                                    read_only=read_only_volume)
    return [
        k8s.V1Volume(name=VOLUME_NAME, persistent_volume_claim=claim),
        k8s.V1Volume(name=SCRATCH_NAME, empty_dir=k8s.V1EmptyDirVolumeSource()),
        k8s.V1Volume(name="xcom", empty_dir=k8s.V1EmptyDirVolumeSource()),
    ]


def stage_pod_name(config: PipelineConfig, run: RunContext, spec: ContainerSpec) -> str:
    """A one-pod stage's name (a pod's, or a local process's): a mapped task's file group is in it too."""
    group = f"-g{spec.index}" if spec.index is not None else ""
    return dns_label(f"{config.name}-{spec.stage}{group}-{run.key}")


def replica_name(job: str, spec: ContainerSpec) -> str:
    """A training replica's name, `<job>-<role>-<i>`: its pod, hostname and (locally) its log file."""
    return f"{job}-{spec.role}-{spec.index}"


def build_stage_pod(config: PipelineConfig, run: RunContext, spec: ContainerSpec) -> k8s.V1Pod:
    """The pod of a single-container CPU stage (validate, prepare, evaluate)."""
    return build_pod(config, run, spec, name=stage_pod_name(config, run, spec))


def gpu_tier(config: PipelineConfig) -> GpuTier | None:
    """The tier named by `training.gpu_tier`, else the one `training.priority` maps to."""
    k8s_config = config.kubernetes
    tier_name = config.training.gpu_tier or k8s_config.tier_by_priority.get(config.training.priority)
    return k8s_config.gpu_tiers.get(tier_name) if tier_name else None


def placement_of(config: PipelineConfig, on_gpu: bool) -> str:
    """Which nodes a replica needs, in words: `GPU tier 'newest' (nodes labelled ...)`, `CPU pool (...)`."""
    if not on_gpu:
        labels = config.kubernetes.node_pools.cpu
        return f"CPU pool (nodes labelled {selector_text(labels)})" if labels else "any node"
    tier_name = config.training.gpu_tier or config.kubernetes.tier_by_priority.get(config.training.priority)
    what = f"GPU tier {tier_name!r}" if gpu_tier(config) is not None else "GPU pool"
    return f"{what} (nodes labelled {selector_text(worker_node_selector(config))} with nvidia.com/gpu free)"


def selector_text(labels: dict[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in labels.items()) or "anything"


def worker_node_selector(config: PipelineConfig) -> dict[str, str]:
    """The GPU pool plus the GPU tier's node selector."""
    tier = gpu_tier(config)
    return {**config.kubernetes.node_pools.gpu, **(tier.node_selector if tier else {})}


def build_job_pods(config: PipelineConfig, run: RunContext, specs: list[ContainerSpec], job: str) -> list[k8s.V1Pod]:
    """One pod per replica, named `<job>-<role>-<i>` with hostname/subdomain so TF_CONFIG's DNS names resolve
    through the job's headless Service; GPU workers go to the GPU pool, chief and PS to CPU nodes.

    Every replica carries `activeDeadlineSeconds` from `training.timeout_minutes`: a replica whose launcher died
    (a lost Airflow worker, a `kill -9`) is still stopped by the kubelet then, cleanup sweep or not."""
    tier = gpu_tier(config)
    pods = []
    for spec in specs:
        name = replica_name(job, spec)
        on_gpu = spec.role == "worker" and spec.resources.gpu > 0
        pods.append(build_pod(config, run, spec, name=name,
                              node_selector=worker_node_selector(config) if on_gpu else None,
                              hostname=name, subdomain=job,
                              priority_class=tier.priority_class if tier else None,  # the whole job, PS included
                              tolerations=tier.tolerations if tier and on_gpu else None,
                              active_deadline_seconds=config.training.timeout_minutes * 60,
                              placement=placement_of(config, on_gpu)))
    return pods


def build_headless_service(config: PipelineConfig, run: RunContext, stage: Stage, job: str) -> k8s.V1Service:
    """The Service that gives each replica pod its `<pod>.<job>.<ns>.svc` DNS name (clusterIP: None)."""
    return k8s.V1Service(
        api_version="v1",
        kind="Service",
        metadata=k8s.V1ObjectMeta(
            name=job,
            namespace=config.kubernetes.namespace,
            labels={"app.kubernetes.io/managed-by": "trainyard", **job_selector(config, run, stage)},
        ),
        spec=k8s.V1ServiceSpec(
            cluster_ip="None",
            publish_not_ready_addresses=True,
            selector=job_selector(config, run, stage),
            ports=[k8s.V1ServicePort(name="grpc", port=config.training.port, target_port=config.training.port)],
        ),
    )


def serving_labels(config: PipelineConfig) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "trainyard", "app.kubernetes.io/name": "tensorflow-serving",
            "trainyard/model": label_value(config.model_name)}


def build_serving_deployment(config: PipelineConfig) -> k8s.V1Deployment:
    """TF Serving (the official image) on the CPU serving pool, reading `models/<model>` from the volume read-only."""
    deploy, volume = config.deploy, config.kubernetes.volume
    labels = serving_labels(config)
    probe = k8s.V1Probe(http_get=k8s.V1HTTPGetAction(path=f"/v1/models/{config.model_name}", port=deploy.rest_port),
                        period_seconds=10, failure_threshold=3)
    container = k8s.V1Container(
        name="tensorflow-serving",
        image=config.kubernetes.image(deploy.image),
        args=[f"--model_name={config.model_name}",
              f"--model_base_path={models_dir(PurePosixPath(volume.mount_path), config.model_name)}",
              f"--port={deploy.grpc_port}", f"--rest_api_port={deploy.rest_port}",
              "--file_system_poll_wait_seconds=1"],
        ports=[k8s.V1ContainerPort(name="grpc", container_port=deploy.grpc_port),
               k8s.V1ContainerPort(name="rest", container_port=deploy.rest_port)],
        resources=resource_requirements(deploy.resources),
        security_context=restricted_security_context(),
        readiness_probe=probe,
        liveness_probe=k8s.V1Probe(tcp_socket=k8s.V1TCPSocketAction(port=deploy.grpc_port), period_seconds=20,
                                   initial_delay_seconds=10),
        volume_mounts=[k8s.V1VolumeMount(name=VOLUME_NAME, mount_path=volume.mount_path, read_only=True),
                       k8s.V1VolumeMount(name=SCRATCH_NAME, mount_path=SCRATCH_PATH)],
    )
    return k8s.V1Deployment(
        api_version="apps/v1",
        kind="Deployment",
        metadata=k8s.V1ObjectMeta(name=f"{config.model_name}-serving", namespace=config.kubernetes.namespace,
                                  labels=labels),
        spec=k8s.V1DeploymentSpec(
            replicas=deploy.replicas,
            selector=k8s.V1LabelSelector(match_labels=labels),
            template=k8s.V1PodTemplateSpec(
                metadata=k8s.V1ObjectMeta(labels=labels),
                spec=k8s.V1PodSpec(
                    service_account_name=config.kubernetes.service_account,
                    automount_service_account_token=False,
                    node_selector=dict(deploy.node_selector or config.kubernetes.node_pools.cpu) or None,
                    security_context=restricted_pod_security_context(),
                    containers=[container],
                    volumes=[
                        k8s.V1Volume(name=VOLUME_NAME, persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
                            claim_name=volume.claim, read_only=True)),
                        k8s.V1Volume(name=SCRATCH_NAME, empty_dir=k8s.V1EmptyDirVolumeSource()),
                    ],
                ),
            ),
        ),
    )


def serving_address(config: PipelineConfig) -> str:
    """The in-cluster gRPC address of the model's Service (what the deploy stage talks to)."""
    return f"{config.model_name}.{config.kubernetes.namespace}.svc:{config.deploy.grpc_port}"


def build_serving_service(config: PipelineConfig) -> k8s.V1Service:
    """ClusterIP Service in front of TF Serving: `<model>.<ns>.svc:8500` (gRPC) and `:8501` (REST)."""
    deploy = config.deploy
    return k8s.V1Service(
        api_version="v1",
        kind="Service",
        metadata=k8s.V1ObjectMeta(name=config.model_name, namespace=config.kubernetes.namespace,
                                  labels=serving_labels(config)),
        spec=k8s.V1ServiceSpec(
            type="ClusterIP",
            selector=serving_labels(config),
            ports=[k8s.V1ServicePort(name="grpc", port=deploy.grpc_port, target_port=deploy.grpc_port),
                   k8s.V1ServicePort(name="rest", port=deploy.rest_port, target_port=deploy.rest_port)],
        ),
    )
