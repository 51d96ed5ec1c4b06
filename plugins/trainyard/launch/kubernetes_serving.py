"""Make sure the model's TF Serving Deployment and ClusterIP Service, and the stream scorer's and lander's Deployments
when the config has `stream:`, exist and match the config (create or patch).

Idempotent, like `kubectl apply` for the two objects Trainyard owns: read, create on 404, else patch to the
built spec. The deploy stage then publishes the version on the volume and talks gRPC to the Service.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kubernetes.client import AppsV1Api, CoreV1Api
from kubernetes.client.exceptions import ApiException

from trainyard.launch.podspec import build_serving_deployment, build_serving_service, serving_address
from trainyard.launch.stream_spec import build_stream_deployments
from trainyard_contract.schema import PipelineConfig


def _apply(read: Callable[..., Any], create: Callable[..., Any], patch: Callable[..., Any], body: Any,
           log: logging.Logger) -> str:
    name, namespace = body.metadata.name, body.metadata.namespace
    try:
        read(name=name, namespace=namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
        create(namespace=namespace, body=body)
        log.info("created %s %s/%s", body.kind, namespace, name)
        return "created"
    patch(name=name, namespace=namespace, body=body)
    log.info("patched %s %s/%s to the config", body.kind, namespace, name)
    return "patched"


def apply_serving_objects(core: CoreV1Api, apps: AppsV1Api, config: PipelineConfig, log: logging.Logger) -> str:
    """Create or patch the Deployments and the Service; return the gRPC address the deploy stage uses."""
    _apply(apps.read_namespaced_deployment, apps.create_namespaced_deployment, apps.patch_namespaced_deployment,
           build_serving_deployment(config), log)
    _apply(core.read_namespaced_service, core.create_namespaced_service, core.patch_namespaced_service,
           build_serving_service(config), log)
    for deployment in build_stream_deployments(config):
        _apply(apps.read_namespaced_deployment, apps.create_namespaced_deployment,
               apps.patch_namespaced_deployment, deployment, log)
    return serving_address(config)
