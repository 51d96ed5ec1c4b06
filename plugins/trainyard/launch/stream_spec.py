"""Pure builders of the stream Deployments: the scorer (`stream:`) and the lander (`stream.land:`), on the CPU pool
beside TF Serving, hardened like every Trainyard pod. No cluster, no I/O: `trainyard render` prints them and the
deploy step creates or patches them with the serving Deployment (kubernetes_serving.py).

The scorer talks gRPC to the model's Service, so it follows every deploy and rollback; it has no volume. The lander
writes the pipeline's partitions, so it mounts the shared volume read-write; it is one replica (Recreate), so two
landers never hold the same day's keys apart.
"""

from __future__ import annotations

from kubernetes.client import models as k8s

from trainyard.launch.podspec import (
    SCRATCH_NAME,
    SCRATCH_PATH,
    VOLUME_NAME,
    label_value,
    resource_requirements,
    restricted_pod_security_context,
    restricted_security_context,
    serving_address,
)
from trainyard_contract.runtime import CONFIG_ENV
from trainyard_contract.schema import PipelineConfig, StreamConfig


def stream_labels(config: PipelineConfig, role: str) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "trainyard", "app.kubernetes.io/name": f"trainyard-stream-{role}",
            "trainyard/pipeline": label_value(config.name)}


def stream_env(config: PipelineConfig, stream: StreamConfig) -> list[k8s.V1EnvVar]:
    """The config (as every stage pod gets it), the broker password and `kubernetes.secrets` by reference."""
    env = [k8s.V1EnvVar(name=CONFIG_ENV, value=config.model_dump_json()),
           k8s.V1EnvVar(name="PYTHONUNBUFFERED", value="1")]
    refs = [*config.kubernetes.secrets, *([stream.password] if stream.password else [])]
    for ref in refs:
        env.append(k8s.V1EnvVar(name=ref.env, value_from=k8s.V1EnvVarSource(
            secret_key_ref=k8s.V1SecretKeySelector(name=ref.secret, key=ref.key))))
    return env


def stream_deployment(config: PipelineConfig, role: str, args: list[str], replicas: int,
                      mount_volume: bool) -> k8s.V1Deployment:
    assert config.stream is not None
    stream, volume = config.stream, config.kubernetes.volume
    labels = stream_labels(config, role)
    mounts = [k8s.V1VolumeMount(name=SCRATCH_NAME, mount_path=SCRATCH_PATH)]
    volumes = [k8s.V1Volume(name=SCRATCH_NAME, empty_dir=k8s.V1EmptyDirVolumeSource())]
    if mount_volume:
        mounts.append(k8s.V1VolumeMount(name=VOLUME_NAME, mount_path=volume.mount_path))
        volumes.append(k8s.V1Volume(name=VOLUME_NAME, persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
            claim_name=volume.claim)))
    container = k8s.V1Container(
        name=role, image=config.kubernetes.image(stream.image), image_pull_policy="IfNotPresent", args=args,
        env=stream_env(config, stream), resources=resource_requirements(stream.resources),
        security_context=restricted_security_context(), volume_mounts=mounts)
    return k8s.V1Deployment(
        api_version="apps/v1", kind="Deployment",
        metadata=k8s.V1ObjectMeta(name=f"{config.model_name}-stream-{role}", namespace=config.kubernetes.namespace,
                                  labels=labels),
        spec=k8s.V1DeploymentSpec(
            replicas=replicas, selector=k8s.V1LabelSelector(match_labels=labels),
            strategy=k8s.V1DeploymentStrategy(type="Recreate") if role == "land" else None,
            template=k8s.V1PodTemplateSpec(
                metadata=k8s.V1ObjectMeta(labels=labels),
                spec=k8s.V1PodSpec(
                    service_account_name=config.kubernetes.service_account,
                    automount_service_account_token=False,
                    # SIGTERM drains the batch in hand: a partition file at most, well inside the default 30 s
                    termination_grace_period_seconds=60,
                    node_selector=dict(config.deploy.node_selector or config.kubernetes.node_pools.cpu) or None,
                    image_pull_secrets=[k8s.V1LocalObjectReference(name=s)
                                        for s in config.kubernetes.image_pull_secrets] or None,
                    security_context=restricted_pod_security_context(),
                    containers=[container], volumes=volumes))))


def build_stream_deployments(config: PipelineConfig) -> list[k8s.V1Deployment]:
    """The scorer's Deployment, and the lander's when the config lands a stream; none without `stream:`."""
    if config.stream is None:
        return []
    deployments = [stream_deployment(config, "score", ["score", "--endpoint", serving_address(config)],
                                     config.stream.replicas, mount_volume=False)]
    if config.stream.land is not None:
        deployments.append(stream_deployment(config, "land", ["land", "--volume", config.kubernetes.volume.mount_path],
                                             1, mount_volume=True))
    return deployments
