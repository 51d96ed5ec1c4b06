"""TF Serving's REST API subset on a threading HTTP server.

GET  /v1/models/<m>[/versions/<v>]            model version status
GET  /v1/models/<m>[/versions/<v>]/metadata   signature_def
POST /v1/models/<m>[/versions/<v>]:predict    {"instances": [...]} (row) or {"inputs": {...}} (columnar)
Errors are `{"error": "..."}` with 400 (bad request), 404 (unknown model/version/path), 405, 411, 413 (body too big).
"""

from __future__ import annotations

import json
import logging
import re
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf import json_format

from trainyard_serving import predict
from trainyard_serving.registry import ModelRegistry, NotFound

log = logging.getLogger("trainyard.serving")
PATH = re.compile(
    r"^/v1/models/(?P<model>[A-Za-z0-9._-]+)(?:/versions/(?P<version>\d+))?(?P<rest>/metadata|:predict)?$"
)


DRAIN_CAP = 64 << 20  # beyond this an oversized request is cut off, not read


class ApiError(Exception):
    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


def rows_to_columns(instances: Any, names: list[str]) -> dict[str, Any]:
    if not isinstance(instances, list) or not instances:
        raise predict.BadRequest("'instances' must be a non-empty list")
    if all(isinstance(row, dict) for row in instances):
        keys = set(instances[0])
        if any(set(row) != keys for row in instances):
            raise predict.BadRequest("every instance must have the same named inputs")
        return {key: [row[key] for row in instances] for key in keys}
    if len(names) == 1:
        return {names[0]: instances}
    raise predict.BadRequest(f"the signature takes {len(names)} named inputs: send each instance as an object")


def predict_body(registry: ModelRegistry, model: str, version: int | None, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or ("instances" in body) == ("inputs" in body):
        raise predict.BadRequest("the request body must be a JSON object with exactly one of 'instances' or 'inputs'")
    if body.get("signature_name", "serving_default") != "serving_default":
        raise predict.BadRequest(f"serving signature name {body['signature_name']!r} not found")
    loaded = registry.get(model, version)
    names = sorted(loaded.inputs)
    if "instances" in body:
        outputs = predict.run(loaded, rows_to_columns(body["instances"], names))
        keys = sorted(outputs)
        rows = len(next(iter(outputs.values())))
        values = {key: predict.to_json_value(outputs[key]) for key in keys}
        return {"predictions": [{key: values[key][i] for key in keys} for i in range(rows)]}
    inputs = body["inputs"]
    columns = inputs if isinstance(inputs, dict) else ({names[0]: inputs} if len(names) == 1 else None)
    if columns is None:
        raise predict.BadRequest(f"'inputs' must be an object of the {len(names)} named inputs")
    outputs = predict.run(loaded, columns)
    return {"outputs": {key: predict.to_json_value(value) for key, value in outputs.items()}}


def status_body(registry: ModelRegistry, model: str, version: int | None) -> dict[str, Any]:
    return {"model_version_status": [
        {"version": str(v), "state": s.state,
         "status": {"error_code": "OK" if not s.error else "UNKNOWN", "error_message": s.error}}
        for v, s in registry.status(model, version)
    ]}


def metadata_body(registry: ModelRegistry, model: str, version: int | None) -> dict[str, Any]:
    loaded = registry.get(model, version)
    signatures = {k: json_format.MessageToDict(v) for k, v in loaded.signature_defs.items()
                  if not k.startswith("__")}
    return {"model_spec": {"name": model, "signature_name": "", "version": str(loaded.version)},
            "metadata": {"signature_def": {"signature_def": signatures}}}


def make_handler(registry: ModelRegistry, max_body_bytes: int) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "trainyard-serving"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
            log.debug("%s %s", self.address_string(), format % args)

        def _send(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self) -> tuple[str, int | None, str]:
            match = PATH.match(self.path.split("?", 1)[0])
            if not match:
                raise ApiError(HTTPStatus.NOT_FOUND, f"Malformed request: {self.command} {self.path}")
            version = int(match["version"]) if match["version"] else None
            return match["model"], version, match["rest"] or ""

        def _handle(self, handler: Any) -> None:
            try:
                self._send(HTTPStatus.OK, handler())
            except ApiError as exc:
                self._send(exc.status, {"error": str(exc)})
            except NotFound as exc:
                self._send(HTTPStatus.NOT_FOUND, {"error": str(exc)})
            except predict.BadRequest as exc:
                self._send(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            except Exception as exc:  # never let a request kill the server
                log.exception("request failed")
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {exc}"})

        def _discard(self, size: int) -> None:
            """Read and drop an oversized body (up to DRAIN_CAP) so the client can read our 413, not an EPIPE."""
            left = min(size, DRAIN_CAP)
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)

        def do_GET(self) -> None:  # noqa: N802
            def answer() -> dict[str, Any]:
                model, version, rest = self._route()
                if rest == ":predict":
                    raise ApiError(HTTPStatus.METHOD_NOT_ALLOWED, "predict needs POST")
                if rest == "/metadata":
                    return metadata_body(registry, model, version)
                return status_body(registry, model, version)

            self._handle(answer)

        def do_POST(self) -> None:  # noqa: N802
            def answer() -> dict[str, Any]:
                length = self.headers.get("Content-Length")
                if length is None:
                    raise ApiError(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required")
                size = int(length) if length.isdigit() else -1
                if size < 0:
                    raise ApiError(HTTPStatus.BAD_REQUEST, "invalid Content-Length")
                if size > max_body_bytes:
                    self._discard(size)
                    self.close_connection = True
                    raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                   f"request body of {size} bytes is larger than the limit of {max_body_bytes}")
                raw = self.rfile.read(size)
                model, version, rest = self._route()
                if rest != ":predict":
                    raise ApiError(HTTPStatus.METHOD_NOT_ALLOWED, f"POST is only for :predict (got {self.path})")
                try:
                    body = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise predict.BadRequest(f"JSON Parse error: {exc}") from None
                return predict_body(registry, model, version, body)

            self._handle(answer)

    return Handler


def make_server(registry: ModelRegistry, host: str, port: int, max_body_bytes: int) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), make_handler(registry, max_body_bytes))
    server.daemon_threads = True
    return server
