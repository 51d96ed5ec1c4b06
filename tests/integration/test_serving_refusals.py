"""The second round of hostile tests against the serving path: silent wrong answers, readers that never read,
http.server's own errors, oversized numbers and answers. Each case reproduces a defect seen when probing the
server, against a real server process on 127.0.0.1 (and the exported signature itself, as TF Serving runs it)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from tests.integration.serving_helpers import Server, export_mixed_model, export_tiny_model, http
from trainyard_contract import layout

pytestmark = pytest.mark.integration
LIMITS = ("--header-timeout", "1", "--body-timeout", "1", "--write-timeout", "1", "--max-unsent-bytes", "4096")
ROW = {"a": 1.0, "n": 94007, "z": 0.5}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("refusals") / layout.MODELS
    export_mixed_model(root / "mixed" / "1")
    export_tiny_model(root / "tiny" / "1")
    return root


@pytest.fixture(scope="module")
def server(models: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    running = Server(models, *LIMITS).start(tmp_path_factory.mktemp("log") / "server.log")
    yield running
    running.stop()


def predict(server: Server, *rows: dict) -> tuple[int, dict]:
    return http("POST", server.url("/v1/models/mixed:predict"), {"instances": list(rows)})


def grpc_predict(server: Server, **columns: np.ndarray) -> predict_pb2.PredictResponse:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "mixed"
    for name, value in columns.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(server.grpc))
    return stub.Predict(request, timeout=30)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_the_exported_signature_itself_refuses_unusable_values(models: Path, value: float) -> None:
    """What real TF Serving runs: the SavedModel's own serving_default, called directly."""
    signature = tf.saved_model.load(str(models / "mixed" / "1")).signatures["serving_default"]
    ok = {"a": tf.constant([1.0, 2.0]), "n": tf.constant([1, 2], tf.int64), "z": tf.constant([float("nan"), 1.0])}
    assert signature(**ok)["class_ids"].shape == (2,)  # NaN in the nullable feature is a missing value
    with pytest.raises(tf.errors.InvalidArgumentError, match="input `a` .* not nullable"):
        signature(**{**ok, "a": tf.constant([1.0, value])})
    if np.isinf(value):
        with pytest.raises(tf.errors.InvalidArgumentError, match="input `z` .* an infinite value"):
            signature(**{**ok, "z": tf.constant([value, 1.0])})


def test_rest_refuses_null_nan_and_infinity_in_a_non_nullable_number(server: Server) -> None:
    """Was: a null answered the same class whatever the other features were (p=0.459)."""
    assert predict(server, ROW)[0] == 200
    for bad in ({"a": None}, {"a": float("nan")}, {"a": float("inf")}):
        status, answer = predict(server, ROW, {**ROW, **bad})
        assert status == 400 and "input `a` (a float number) got a missing (null/NaN) or infinite" in answer["error"]
    status, answer = http("POST", server.url("/v1/models/mixed:predict"),
                          raw=b'{"instances": [{"a": 1e400, "n": 1, "z": 0.5}]}')
    assert status == 400 and "input `a`" in answer["error"]
    assert predict(server, {**ROW, "z": None})[0] == 200  # nullable: null is imputed


def test_grpc_refuses_nan_in_a_non_nullable_number(server: Server) -> None:
    with pytest.raises(grpc.RpcError) as info:
        grpc_predict(server, a=np.array([np.nan], np.float32), n=np.array([1], np.int64),
                     z=np.array([0.5], np.float32))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "input `a`" in info.value.details()


@pytest.mark.parametrize(("value", "words"), [
    (94007.5, "expects an integer (int64), got 94007.5"),
    (1e30, "expects an integer (int64), got 1e+30"),
    (None, "expects an integer (int64), got null"),
    ("7", "expects an integer (int64), got text"),
])
def test_rest_refuses_what_is_not_an_integer_for_an_int_input(server: Server, value: object, words: str) -> None:
    """Was: `94007.5` was truncated to 94007 (gRPC refused it), and errors spoke numpy (`kind 'U'`)."""
    status, answer = predict(server, {**ROW, "n": value})
    assert status == 400 and words in answer["error"] and "input 'n'" in answer["error"], answer
    assert "kind" not in answer["error"]
    assert predict(server, {**ROW, "n": 94007.0})[0] == 200  # a whole number written with a fraction is fine


def test_a_number_too_long_to_convert_is_a_400(server: Server) -> None:
    """Was: HTTP 500 and a traceback (Python refuses to convert integers of more than 4,300 digits)."""
    body = b'{"instances": [{"a": 1.0, "n": ' + b"9" * 5000 + b', "z": 0.5}]}'
    status, answer = http("POST", server.url("/v1/models/mixed:predict"), raw=body)
    assert status == 400 and "too long to convert" in answer["error"]
    head = b"POST /v1/models/mixed:predict HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n"
    assert exchange(server, head).startswith(b"HTTP/1.1 413")
    assert "Traceback" not in server.log.read_text()


def exchange(server: Server, data: bytes, wait: float = 10.0) -> bytes:
    """Send raw bytes, keep the sending side open (a client still waiting), and read until the server closes."""
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=wait) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
        return b"".join(chunks)


def parse(answer: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


@pytest.mark.parametrize(("data", "status"), [
    (b"GARBAGE\r\n\r\n", 400),
    (b"BREW /v1/models/mixed HTTP/1.1\r\nHost: x\r\n\r\n", 501),
    (b"GET /" + b"x" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
    (b"GET /v1/models/mixed HTTP/1.1\r\n" + b"X-Big: y\r\n" * 200 + b"\r\n", 431),
    (b"GET /v1/models/mixed HTTP/2.0\r\n\r\n", 505),
])
def test_http_server_s_own_errors_are_json_without_a_version_banner(server: Server, data: bytes,
                                                                     status: int) -> None:
    """Was: HTML bodies, and a `Server: BaseHTTP/0.6 Python/3.11.x` header."""
    code, headers, body = parse(exchange(server, data))
    assert code == status and isinstance(body["error"], str) and body["error"]
    assert headers["Content-Type"] == "application/json" and headers["Server"] == "trainyard-serving"
    _, headers, _ = parse(exchange(server, b"GET /v1/models/mixed HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    assert headers["Server"] == "trainyard-serving"


def test_408_reaches_a_client_that_is_still_waiting(server: Server) -> None:
    """Was: the watchdog closed both directions, so a slow client got an empty reply, never the 408."""
    head = b"POST /v1/models/mixed:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    code, _, body = parse(exchange(server, head + b'{"instances": ['))
    assert code == 408 and "the body did not arrive within 1 s" in body["error"]
    code, _, body = parse(exchange(server, b"POST /v1/mod"))  # headers never finished
    assert code == 408 and "did not arrive within 1 s" in body["error"]


def test_413_reaches_a_client_that_stopped_sending(server: Server) -> None:
    head = b"POST /v1/models/mixed:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n\r\n"
    code, _, body = parse(exchange(server, head + b"[" * 100_000))
    assert code == 413 and "larger than the limit" in body["error"]


def threads_of(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in text.splitlines() if line.startswith("Threads:")).split()[1])


def test_a_client_that_never_reads_its_answer_is_dropped(server: Server) -> None:
    """Was: such a client held a server thread and its answer's memory forever."""
    rows = json.dumps({"instances": [ROW] * 10_000}).encode()
    head = f"POST /v1/models/mixed:predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(rows)}\r\n\r\n".encode()
    idle_threads = threads_of(server.process.pid)
    readers = []
    for _ in range(4):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
        sock.connect(("127.0.0.1", server.rest_port))
        sock.sendall(head + rows)
        readers.append(sock)
    try:
        time.sleep(0.5)
        assert threads_of(server.process.pid) >= idle_threads + 4  # each is stuck writing its ~1.5 MB answer
        deadline = time.monotonic() + 15
        while threads_of(server.process.pid) > idle_threads and time.monotonic() < deadline:
            time.sleep(0.2)
        assert threads_of(server.process.pid) <= idle_threads  # dropped after the 1 s write timeout
        for sock in readers:  # what a reader finally gets is a cut-off answer, then the end
            sock.settimeout(5)
            received = b""
            try:
                while chunk := sock.recv(1 << 20):
                    received += chunk
            except (ConnectionResetError, TimeoutError):
                pass
            assert received.startswith(b"HTTP/1.1 200") and len(received) < 1_000_000
    finally:
        for sock in readers:
            sock.close()
    assert predict(server, ROW)[0] == 200


def test_a_small_request_cannot_ask_for_a_huge_answer(server: Server) -> None:
    """Was: a 3 KB gRPC request declaring 100,000 rows (one value, filled out) got a 9 MB answer."""
    def one_value(rows: int, dtype: int, **value: object) -> tensor_pb2.TensorProto:
        return tensor_pb2.TensorProto(dtype=dtype, tensor_shape=tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=rows)]), **value)

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "mixed"
    request.inputs["a"].CopyFrom(one_value(100_000, types_pb2.DT_FLOAT, float_val=[1.0]))
    request.inputs["n"].CopyFrom(one_value(100_000, types_pb2.DT_INT64, int64_val=[1]))
    request.inputs["z"].CopyFrom(one_value(100_000, types_pb2.DT_FLOAT, float_val=[1.0]))
    assert request.ByteSize() < 3000
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(server.grpc))
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "declares 100000 rows, more than the limit of 10000 rows per request" in info.value.details()
