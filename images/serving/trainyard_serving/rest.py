"""TF Serving's REST API subset on a threading HTTP server that bad clients cannot tie up.

GET  /v1/models/<m>[/versions/<v>|/labels/<l>]            model version status
GET  /v1/models/<m>[/versions/<v>|/labels/<l>]/metadata   signature_def
POST /v1/models/<m>[/versions/<v>|/labels/<l>]:predict    {"instances": [...]} (row) or {"inputs": {...}} (columnar)
Every answer, errors included, is JSON: `{"error": "..."}` with 400 (bad request, also http.server's own malformed
request line or headers), 404 (unknown model/version/path), 405, 408 (request too slow), 411, 413 (body too big),
414/431 (request line or headers too long), 501 (unknown method), 503 (too many connections). The `Server` header
names no Python version. The limits live in limits.py.

A thread serves each connection, as http.server does, but a watchdog enforces the deadlines: a request whose
headers (or next request, when kept alive) or body do not arrive in time has its reading side shut, so the thread
can still send the 408 (or the 413 after a drain) to a client that is waiting for it; an answer the client does
not take within `write_timeout` has the whole connection shut, so the thread ends and the answer's memory is freed
(and handed back to the OS: glibc keeps freed arenas otherwise). Past `max_connections` a new connection is
answered 503 without a thread. Clients that hang up early are logged at debug level, without a traceback.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
import logging
import re
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from google.protobuf import json_format

from trainyard_serving import predict
from trainyard_serving.limits import Limits
from trainyard_serving.registry import ModelRegistry, NotFound, unknown_label

log = logging.getLogger("trainyard.serving")
PATH = re.compile(
    r"^/v1/models/(?P<model>[A-Za-z0-9._-]+)(?:/versions/(?P<version>\d+)|/labels/(?P<label>[A-Za-z0-9._-]+))?"
    r"(?P<rest>/metadata|:predict)?$"
)
JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
BRACKET_STEP = bytes(1 if b in b"[{" else 255 if b in b"]}" else 0 for b in range(256))  # +1 / -1 as int8
DRAIN_CAP = 64 << 20  # beyond this an oversized request is cut off, not read
CLIENT_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)
LARGE_ANSWER = 1 << 20  # after an answer this big, freed memory is handed back to the OS
MAX_LENGTH_DIGITS = 18  # a Content-Length longer than this is over any limit (and not worth converting)
SERVED = threading.local()  # per connection thread: whether it built a large answer (memory to hand back)


M_MMAP_THRESHOLD = -3  # glibc mallopt parameters (malloc.h)
M_ARENA_MAX = -8


@functools.cache
def libc() -> ctypes.CDLL | None:
    """glibc, loaded once (`find_library` runs `ldconfig`, not something to do after every large answer); None
    where there is no C library to tune."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except OSError:
        return None


def tune_allocator() -> None:
    """Make big buffers go back to the OS when freed. glibc raises its mmap threshold to the size of each large
    block freed (up to 32 MB), after which answers of many MB are carved from the heap and stay mapped when a
    slow client is dropped; a fixed 1 MiB threshold keeps every large buffer in its own mapping, and few arenas
    keep the rest from spreading over one heap per thread."""
    library = libc()
    if library is not None and hasattr(library, "mallopt"):  # not glibc: nothing to tune
        library.mallopt(M_MMAP_THRESHOLD, 1 << 20)
        library.mallopt(M_ARENA_MAX, 2)


def release_freed_memory() -> None:
    """glibc's malloc_trim(0): return the free pages of every arena to the OS. The Python lists and strings of a
    large answer are freed into the heap of the thread that built it, and glibc would keep those pages mapped."""
    library = libc()
    if library is not None and hasattr(library, "malloc_trim"):  # not glibc: nothing to do
        library.malloc_trim(0)


class ApiError(Exception):
    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


def bracket_depth(raw: bytes) -> int:
    """The deepest `[`/`{` nesting of a byte string, at C speed: everything but brackets is dropped first."""
    kept = raw.translate(None, NOT_BRACKETS)
    if not kept:
        return 0
    return int(np.cumsum(np.frombuffer(kept.translate(BRACKET_STEP), dtype=np.int8), dtype=np.int32).max())


def json_depth(raw: bytes, limit: int) -> int:
    """How deeply a JSON text nests, checked before it is parsed so a hostile depth never reaches the parser.

    Brackets inside strings are counted too, which costs nothing; only a body that seems too deep is measured
    again with its strings blanked out, so a legitimate `"[[["` in a value is not refused. (A `]` in a string can
    hide depth; the parser's own recursion limit then answers 400 as well.)"""
    depth = bracket_depth(raw)
    if depth > limit and b'"' in raw:
        depth = bracket_depth(JSON_STRING.sub(b'""', raw))
    return depth


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


def predict_body(registry: ModelRegistry, model: str, version: int | None, body: Any, limits: Limits,
                 json_booleans: bool) -> dict[str, Any]:
    if not isinstance(body, dict) or ("instances" in body) == ("inputs" in body):
        raise predict.BadRequest("the request body must be a JSON object with exactly one of 'instances' or 'inputs'")
    if body.get("signature_name", "serving_default") != "serving_default":
        raise predict.BadRequest(f"serving signature name {body['signature_name']!r} not found")
    loaded = registry.get(model, version)
    names = sorted(loaded.inputs)
    if "instances" in body:
        outputs = predict.run(loaded, rows_to_columns(body["instances"], names), limits, json_booleans)
        keys = sorted(outputs)
        rows = len(next(iter(outputs.values())))
        values = {key: predict.to_json_value(outputs[key]) for key in keys}
        if len(keys) == 1:  # as TF Serving: a single output is not wrapped in an object per row
            return {"predictions": values[keys[0]]}
        return {"predictions": [{key: values[key][i] for key in keys} for i in range(rows)]}
    inputs = body["inputs"]
    columns = inputs if isinstance(inputs, dict) else ({names[0]: inputs} if len(names) == 1 else None)
    if columns is None:
        raise predict.BadRequest(f"'inputs' must be an object of the {len(names)} named inputs")
    outputs = predict.run(loaded, columns, limits, json_booleans)
    if len(outputs) == 1:  # as TF Serving: a single output's values are `outputs` themselves
        return {"outputs": predict.to_json_value(next(iter(outputs.values())))}
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


class Watchdog(threading.Thread):
    """Enforces per-connection deadlines. A read deadline shuts the reading side (a blocked read returns end of
    file, and the thread can still answer 408); a write deadline shuts both sides (a blocked send fails, and the
    thread ends). Also hands freed memory back to the OS after large answers (`trim_soon`)."""

    def __init__(self, interval: float = 0.25):
        super().__init__(name="rest-watchdog", daemon=True)
        self.interval = interval
        self._deadlines: dict[socket.socket, tuple[float, bool]] = {}
        self._expired: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._trim = threading.Event()

    def arm(self, connection: socket.socket, seconds: float, writing: bool = False) -> None:
        with self._lock:
            self._deadlines[connection] = (time.monotonic() + seconds, writing)

    def disarm(self, connection: socket.socket) -> None:
        with self._lock:
            self._deadlines.pop(connection, None)

    def expired(self, connection: socket.socket) -> bool:
        """Whether a read deadline of this connection passed (its reading side is shut)."""
        with self._lock:
            return connection in self._expired

    def forget(self, connection: socket.socket) -> None:
        with self._lock:
            self._deadlines.pop(connection, None)
            self._expired.discard(connection)

    def trim_soon(self) -> None:
        self._trim.set()

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            with self._lock:
                late = [(c, writing) for c, (deadline, writing) in self._deadlines.items() if deadline < now]
                for connection, writing in late:
                    del self._deadlines[connection]
                    if not writing:
                        self._expired.add(connection)
            for connection, writing in late:
                try:
                    connection.shutdown(socket.SHUT_RDWR if writing else socket.SHUT_RD)
                except OSError:
                    pass
            if self._trim.is_set():
                self._trim.clear()
                release_freed_memory()

    def stop(self) -> None:
        self._stop.set()


def announced_size(length: str | None) -> int:
    """The body size a Content-Length header announces: 411 without one, 400 for anything but digits. A 5,000-digit
    length is not converted: it is over any limit."""
    if length is None:
        raise ApiError(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required")
    digits = length.strip()
    if not (digits.isascii() and digits.isdigit()):
        raise ApiError(HTTPStatus.BAD_REQUEST, "invalid Content-Length")
    return int(digits) if len(digits) <= MAX_LENGTH_DIGITS else 10 ** MAX_LENGTH_DIGITS


def parse_json(raw: bytes, max_depth: int) -> Any:
    """A request body as JSON, its depth checked before the parser sees it; every way it can be wrong is a 400."""
    depth = json_depth(raw, max_depth)
    if depth > max_depth:
        raise predict.BadRequest(f"JSON nested {depth} levels deep, more than the limit of {max_depth}")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise predict.BadRequest(f"JSON Parse error: {exc}") from None
    except ValueError as exc:  # an integer of more than 4,300 digits (Python's conversion limit)
        raise predict.BadRequest(f"a number in the body is too long to convert: {exc}") from None


class ApiHandler(BaseHTTPRequestHandler):
    """The requests of one connection. `self.server` is the `Server`: the model registry, the limits and the
    watchdog that enforces the deadlines."""

    server: Server
    protocol_version = "HTTP/1.1"
    server_version = "trainyard-serving"

    def version_string(self) -> str:
        """The `Server` header: the product, not the Python version behind it."""
        return self.server_version

    def setup(self) -> None:
        super().setup()
        try:  # the kernel holds at most about this much of an answer a client is not reading
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.server.limits.max_unsent_bytes)
        except OSError:
            pass

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        self.server.watchdog.forget(self.connection)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (a malformed request line, headers too long, an unknown method) as JSON;
        a request cut short by its header deadline is a 408, whatever its partial text looked like."""
        status = HTTPStatus(code)
        if self.server.watchdog.expired(self.connection):
            status, message = HTTPStatus.REQUEST_TIMEOUT, (f"the request did not arrive within "
                                                           f"{self.server.limits.header_timeout:g} s")
        if self.request_version in ("", "HTTP/0.9"):
            self.request_version = "HTTP/1.1"  # answer with a status line and headers, never bare
        self.close_connection = True
        self._send(status, {"error": message or status.phrase})

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if self.server.watchdog.expired(self.connection):  # the headers were cut off by their deadline
            self.send_error(HTTPStatus.REQUEST_TIMEOUT)
            return False
        return True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        log.debug("%s %s", self.address_string(), format % args)

    def handle_one_request(self) -> None:
        """The request line and headers (or, kept alive, the next request) within `header_timeout`."""
        self.server.watchdog.arm(self.connection, self.server.limits.header_timeout)
        try:
            super().handle_one_request()
        except CLIENT_GONE:
            self.close_connection = True
        except OSError as exc:  # closed by the watchdog mid-read
            log.debug("connection from %s closed: %s", self.address_string(), exc)
            self.close_connection = True
        finally:
            self.server.watchdog.disarm(self.connection)

    def _send(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
        """Write the answer within `write_timeout`; a client that does not take it in time is dropped."""
        data = json.dumps(payload).encode()
        self.server.watchdog.arm(self.connection, self.server.limits.write_timeout, writing=True)
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except OSError as exc:  # the client left, or did not read its answer in time (the watchdog shut it)
            log.debug("client %s did not take its answer: %s", self.address_string(), type(exc).__name__)
            self.close_connection = True
        finally:
            self.server.watchdog.disarm(self.connection)
            if len(data) >= LARGE_ANSWER:
                SERVED.large_answer = True

    def _route(self) -> tuple[str, int | None, str]:
        match = PATH.match(self.path.split("?", 1)[0])
        if not match:
            raise ApiError(HTTPStatus.NOT_FOUND, f"Malformed request: {self.command} {self.path}")
        if match["label"]:
            raise predict.BadRequest(unknown_label(match["label"]))
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
        except RecursionError:
            self._send(HTTPStatus.BAD_REQUEST, {"error": "JSON nested too deeply"})
        except CLIENT_GONE:
            self.close_connection = True
        except Exception as exc:  # never let a request kill the server
            log.exception("request failed")
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {exc}"})

    def _discard(self, size: int) -> None:
        """Read and drop an oversized body (up to DRAIN_CAP, within `body_timeout`) so the client can read our
        413, not an EPIPE."""
        self.server.watchdog.arm(self.connection, self.server.limits.body_timeout)
        left = min(size, DRAIN_CAP)
        try:
            while left > 0:
                chunk = self.rfile.read1(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass
        finally:
            self.server.watchdog.disarm(self.connection)

    def _read_body(self, size: int) -> bytes:
        """Exactly `size` bytes within `body_timeout`; a short or slow body is refused, never processed."""
        self.server.watchdog.arm(self.connection, self.server.limits.body_timeout)
        chunks, left, started = [], size, time.monotonic()
        try:
            while left > 0:
                chunk = self.rfile.read1(min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        except OSError:
            left = left or 1
        finally:
            self.server.watchdog.disarm(self.connection)
        if left:
            self.close_connection = True
            if time.monotonic() - started >= self.server.limits.body_timeout:
                raise ApiError(HTTPStatus.REQUEST_TIMEOUT,
                               f"the body did not arrive within {self.server.limits.body_timeout:g} s")
            raise predict.BadRequest(f"the body ended after {size - left} of the {size} bytes its "
                                     "Content-Length announced")
        return b"".join(chunks)

    def do_GET(self) -> None:  # noqa: N802
        def answer() -> dict[str, Any]:
            model, version, rest = self._route()
            if rest == ":predict":
                raise ApiError(HTTPStatus.METHOD_NOT_ALLOWED, "predict needs POST")
            if rest == "/metadata":
                return metadata_body(self.server.registry, model, version)
            return status_body(self.server.registry, model, version)

        self._handle(answer)

    def do_POST(self) -> None:  # noqa: N802
        def answer() -> dict[str, Any]:
            limits = self.server.limits
            try:
                size = announced_size(self.headers.get("Content-Length"))
            except ApiError:
                self.close_connection = True
                raise
            if size > limits.max_body_bytes:
                self._discard(size)
                self.close_connection = True
                raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f"request body of {size} bytes is larger than the limit of {limits.max_body_bytes}")
            raw = self._read_body(size)
            model, version, rest = self._route()
            if rest != ":predict":
                raise ApiError(HTTPStatus.METHOD_NOT_ALLOWED, f"POST is only for :predict (got {self.path})")
            body = parse_json(raw, limits.max_json_depth)
            return predict_body(self.server.registry, model, version, body, limits, b"true" in raw or b"false" in raw)

        self._handle(answer)


class Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with a connection cap, a real listen backlog and one-line logs for dropped clients."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], registry: ModelRegistry, limits: Limits):
        self.registry = registry
        self.limits = limits
        self.request_queue_size = limits.listen_backlog
        self.watchdog = Watchdog()
        self._open = threading.BoundedSemaphore(limits.max_connections)
        super().__init__(address, ApiHandler)
        self.watchdog.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._open.acquire(blocking=False):
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._open.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._open.release()
            if getattr(SERVED, "large_answer", False):  # the handler and its answer are gone by now
                SERVED.large_answer = False
                self.watchdog.trim_soon()

    def _refuse(self, request: socket.socket) -> None:
        body = json.dumps({"error": f"too many connections (limit {self.limits.max_connections}); "
                                   "try again shortly"}).encode()
        try:
            request.settimeout(1.0)
            request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                            b"Connection: close\r\nRetry-After: 1\r\n"
                            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        except OSError:
            pass
        finally:
            self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning("connection from %s ended with an error", client_address, exc_info=log.isEnabledFor(logging.DEBUG))

    def server_close(self) -> None:
        self.watchdog.stop()
        super().server_close()


def make_server(registry: ModelRegistry, host: str, port: int, limits: Limits) -> Server:
    tune_allocator()
    return Server((host, port), registry, limits)
