"""A small client of Airflow 3's public REST API (`/api/v2`), standard library only.

Used by `trainyard mark-data` and the stream lander (register new data for asset-scheduled pipelines), the
integration tests and the scheduling benchmark: the same calls a user's script or CI job makes against a running
api-server. In the contract because the stream image registers asset events too.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


class ApiError(RuntimeError):
    """A non-2xx answer; `status` and `detail` are the server's."""

    def __init__(self, method: str, path: str, status: int, detail: Any):
        super().__init__(f"{method} {path}: HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


def request(method: str, url: str, body: Any = None, token: str | None = None, timeout: float = 30) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            detail = json.loads(raw).get("detail", raw.decode(errors="replace"))
        except (ValueError, AttributeError):
            detail = raw.decode(errors="replace")
        raise ApiError(method, urllib.parse.urlsplit(url).path, exc.code, detail) from None
    return json.loads(raw) if raw else None


def get_token(base_url: str, username: str | None = None, password: str | None = None) -> str:
    """A JWT from the api-server: with credentials (`POST /auth/token`), else the all-admins development mode's
    credential-free `GET /auth/token` (SimpleAuthManager with `simple_auth_manager_all_admins`)."""
    url = f"{base_url.rstrip('/')}/auth/token"
    if username:
        answer = request("POST", url, {"username": username, "password": password or ""})
    else:
        answer = request("GET", url)
    return answer["access_token"]


class AirflowApi:
    """`/api/v2` of one api-server with one token."""

    def __init__(self, base_url: str, token: str):
        self.base_url = base_url.rstrip("/")
        self.token = token

    @classmethod
    def from_env(cls, base_url: str | None = None) -> AirflowApi:
        """`AIRFLOW_API_URL` (default http://127.0.0.1:8080) and `AIRFLOW_API_TOKEN`, or `AIRFLOW_USERNAME` and
        `AIRFLOW_PASSWORD`, or no credentials (the all-admins development mode)."""
        url = base_url or os.environ.get("AIRFLOW_API_URL") or "http://127.0.0.1:8080"
        token = os.environ.get("AIRFLOW_API_TOKEN") or get_token(
            url, os.environ.get("AIRFLOW_USERNAME"), os.environ.get("AIRFLOW_PASSWORD"))
        return cls(url, token)

    def call(self, method: str, path: str, body: Any = None, **query: Any) -> Any:
        url = f"{self.base_url}/api/v2{path}"
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None}, doseq=True)
        return request(method, url, body, self.token)

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None, run_id: str | None = None,
                logical_date: str | None = None) -> dict[str, Any]:
        """Trigger a run (now, or for `logical_date`); Airflow validates `conf` against the DAG's Params (HTTP 400
        when it is invalid)."""
        body: dict[str, Any] = {"logical_date": logical_date, "conf": conf or {}}
        if run_id:
            body["dag_run_id"] = run_id
        return self.call("POST", f"/dags/{urllib.parse.quote(dag_id)}/dagRuns", body)

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.call("GET", f"/dags/{urllib.parse.quote(dag_id)}/dagRuns/{urllib.parse.quote(run_id)}")

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        return self.call("GET", f"/dags/{urllib.parse.quote(dag_id)}/dagRuns", limit=100,
                         order_by="run_after")["dag_runs"]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        path = f"/dags/{urllib.parse.quote(dag_id)}/dagRuns/{urllib.parse.quote(run_id)}/taskInstances"
        return self.call("GET", path, limit=100)["task_instances"]

    def set_paused(self, dag_id: str, paused: bool) -> dict[str, Any]:
        return self.call("PATCH", f"/dags/{urllib.parse.quote(dag_id)}", {"is_paused": paused})

    def asset_id(self, uri: str) -> int:
        """The id of the Asset with exactly this URI (it exists once a DAG that uses it has been parsed)."""
        found = [a for a in self.call("GET", "/assets", uri_pattern=uri, limit=100)["assets"] if a["uri"] == uri]
        if not found:
            raise LookupError(f"no Airflow Asset with URI {uri!r}: is a DAG scheduled on it parsed yet?")
        return int(found[0]["id"])

    def mark_asset(self, uri: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Register an asset event ("new data landed"): asset-scheduled DAGs on it get a run."""
        return self.call("POST", "/assets/events", {"asset_id": self.asset_id(uri), "extra": extra or {}})
