"""A training job's lease: how a job whose launcher died is told from one that is running, without Airflow's DB.

The task that runs a job renews an annotation on the job's headless Service every `RENEW_SECONDS`. A job whose
lease is older than `LEASE_SECONDS` has lost its launcher (a `kill -9`, a lost Airflow worker, a node gone): nobody
watches its replicas, follows its chief or will delete it. `sweep_expired_jobs` deletes such a job's Service and
pods (the pods also carry an ownerReference to the Service, so the garbage collector finishes what a sweep that
dies half-way began). It runs before every new job, in every `teardown_train` task and as `trainyard cleanup`,
which an operator can schedule; the replicas' `activeDeadlineSeconds` is the bound when nothing runs at all.

Two clocks meet here: the renewing launcher's (the time it writes) and the sweeper's (the time it compares with).
A sweeper whose clock runs far ahead would see live jobs' leases expire early, so the lease is long (60 s) against
the renewal (10 s): clocks within ~50 s of each other never misjudge a live job.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

from kubernetes.client import CoreV1Api
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

from trainyard.launch.kubernetes_api import api_error, ignore_not_found

RENEWED = "trainyard.io/lease-renewed"
LEASE = "trainyard.io/lease-seconds"
LEASE_SECONDS = 60
RENEW_SECONDS = 10
JOB_SERVICES = "app.kubernetes.io/managed-by=trainyard,trainyard/stage"  # the training jobs' headless Services


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def lease_annotations(now: dt.datetime, lease_seconds: int = LEASE_SECONDS) -> dict[str, str]:
    return {RENEWED: now.isoformat(timespec="seconds"), LEASE: str(lease_seconds)}


def renew(core: CoreV1Api, namespace: str, service: str, now: dt.datetime) -> None:
    """Push the lease forward (a merge patch of one annotation)."""
    core.patch_namespaced_service(name=service, namespace=namespace,
                                  body={"metadata": {"annotations": {RENEWED: now.isoformat(timespec="seconds")}}})


def lease_expiry(service: k8s.V1Service) -> dt.datetime | None:
    """When the job's lease runs out; None for a Service that carries no lease (not a job's, or unreadable)."""
    annotations = service.metadata.annotations or {}
    try:
        renewed = dt.datetime.fromisoformat(annotations[RENEWED])
        seconds = int(annotations.get(LEASE, LEASE_SECONDS))
    except (KeyError, ValueError):
        return None
    if renewed.tzinfo is None:
        renewed = renewed.replace(tzinfo=dt.UTC)
    return renewed + dt.timedelta(seconds=seconds)


def sweep_expired_jobs(core: CoreV1Api, namespace: str, log: logging.Logger, *,
                       now: Callable[[], dt.datetime] = utcnow, dry_run: bool = False,
                       extra_selector: str = "") -> list[str]:
    """Delete every training job in `namespace` whose lease has expired: its replica pods (no grace: nobody
    will read their result) and its Service. Returns the jobs' names. API errors on one job are logged and the
    sweep goes on to the next; a 403 on the list itself is raised (the caller lacks `list services`)."""
    selector = ",".join(part for part in (JOB_SERVICES, extra_selector) if part)
    services = core.list_namespaced_service(namespace=namespace, label_selector=selector).items
    swept = []
    for service in services:
        expiry = lease_expiry(service)
        if expiry is None or expiry > now():
            continue
        name = service.metadata.name
        age = (now() - expiry).total_seconds() + int((service.metadata.annotations or {}).get(LEASE, LEASE_SECONDS))
        swept.append(name)
        if dry_run:
            log.info("cleanup: job %s/%s has had no launcher for %.0fs (would delete it)", namespace, name, age)
            continue
        log.warning("cleanup: job %s/%s has had no launcher for %.0fs: deleting its pods and Service",
                    namespace, name, age)
        selector = ",".join(f"{k}={v}" for k, v in sorted((service.spec.selector or {}).items()))
        try:
            if selector:  # never an empty selector: that would be every pod in the namespace
                for pod in core.list_namespaced_pod(namespace=namespace, label_selector=selector).items:
                    ignore_not_found(core.delete_namespaced_pod, name=pod.metadata.name, namespace=namespace,
                                 body=k8s.V1DeleteOptions(grace_period_seconds=0, propagation_policy="Background"))
            ignore_not_found(core.delete_namespaced_service, name=name, namespace=namespace,
                         body=k8s.V1DeleteOptions(propagation_policy="Background"))
        except ApiException as exc:
            log.error("cleanup: could not delete job %s/%s: %s", namespace, name, api_error(exc))
    return swept
