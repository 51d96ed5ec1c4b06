"""The local server against hostile and broken clients, stale servers and crashes: each case reproduces a defect
seen when probing it, against a real server process on 127.0.0.1. Loops are bounded in count and time."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from tests.integration.serving_helpers import Server, export_tiny_model, http
from trainyard_contract import layout

pytestmark = pytest.mark.integration
LIMITS = ("--header-timeout", "1", "--body-timeout", "1", "--max-connections", "300")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hardening") / layout.MODELS
    export_tiny_model(root / "tiny" / "1")
    return root


@pytest.fixture(scope="module")
def server(models: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    running = Server(models, *LIMITS).start(tmp_path_factory.mktemp("log") / "server.log")
    yield running
    running.stop()


def stub(server: Server) -> prediction_service_pb2_grpc.PredictionServiceStub:
    return prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(server.grpc))


def request_with(**inputs: tensor_pb2.TensorProto) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tiny"
    for name, proto in inputs.items():
        request.inputs[name].CopyFrom(proto)
    return request


def good() -> dict[str, tensor_pb2.TensorProto]:
    return {n: tf.make_tensor_proto(np.array([1.0, 0.0], dtype=np.float32)) for n in ("a", "b")}


def declared(dims: list[int], dtype: int = types_pb2.DT_FLOAT) -> tensor_pb2.TensorProto:
    """A TensorProto that declares a shape and carries no content."""
    return tensor_pb2.TensorProto(dtype=dtype, tensor_shape=tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims]))


def rss_peak_kib(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in text.splitlines() if line.startswith("VmHWM:")).split()[1])


def grpc_error(call, request) -> grpc.RpcError:  # noqa: ANN001
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30)
    return info.value


def test_a_second_server_cannot_share_the_grpc_port(server: Server, models: Path, tmp_path: Path) -> None:
    intruder = Server(models, grpc_port=server.grpc_port)
    with pytest.raises(RuntimeError, match="server exited") as info:
        intruder.start(tmp_path / "intruder.log")
    assert f"cannot listen for gRPC on 127.0.0.1:{server.grpc_port}" in str(info.value)
    assert intruder.process.returncode == 1
    answers = [stub(server).Predict(request_with(**good()), timeout=30).model_spec.version.value for _ in range(20)]
    assert answers == [1] * 20  # every fresh channel reaches the one server on the port


def test_huge_declared_shapes_are_refused_before_any_allocation(server: Server) -> None:
    before = rss_peak_kib(server.process.pid)
    error = grpc_error(stub(server).Predict, request_with(a=declared([1 << 28]), b=declared([1 << 28])))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "more than 16777216 values" in error.details()
    many = {f"x{i}": declared([1 << 28]) for i in range(64)}  # the probe: 64 such inputs, 1.6 KB on the wire
    assert grpc_error(stub(server).Predict, request_with(**many)).code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rss_peak_kib(server.process.pid) - before < 100 * 1024  # was +2.1 GB


@pytest.mark.parametrize(("proto", "message"), [
    (declared([2], types_pb2.DT_INVALID), "expects float but"),
    (declared([2], types_pb2.DT_RESOURCE), "expects float but resource is provided"),
    (declared([1 << 40]), "more than 16777216 values"),
    (declared([-1]), "dimension -1 is not a size"),
    (tf.make_tensor_proto(np.array([1, 0], dtype=np.int64)), "expects float but int64 is provided"),
    (tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=3)]), tensor_content=b"\x00" * 5), "cannot decode"),
])
def test_bad_tensor_protos_are_invalid_argument_never_unknown(server: Server, proto: tensor_pb2.TensorProto,
                                                              message: str) -> None:
    inputs = good()
    inputs["a"] = proto
    error = grpc_error(stub(server).Predict, request_with(**inputs))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and message in error.details(), error.details()


def test_grpc_is_as_strict_as_tf_serving(server: Server) -> None:
    empty = {n: tf.make_tensor_proto(np.zeros([0], dtype=np.float32)) for n in ("a", "b")}
    assert "no rows" in grpc_error(stub(server).Predict, request_with(**empty)).details()
    filtered = request_with(**good())
    filtered.output_filter.append("probabilitiez")
    error = grpc_error(stub(server).Predict, filtered)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "output tensor alias not found in signature: probabilitiez" in error.details()
    labelled = request_with(**good())
    labelled.model_spec.version_label = "stable"
    error = grpc_error(stub(server).Predict, labelled)
    assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                "Unrecognized servable version label: stable")


@pytest.mark.parametrize(("path", "body", "message"), [
    ("/v1/models/tiny:predict", b"[" * 10_000 + b"]" * 10_000, "JSON nested 10000 levels deep"),
    ("/v1/models/tiny:predict", json.dumps({"instances": [{"a": True, "b": 0.0}]}).encode(), "got a JSON boolean"),
    ("/v1/models/tiny:predict", json.dumps({"inputs": {"a": [], "b": []}}).encode(), "no rows"),
    ("/v1/models/tiny/labels/stable:predict", json.dumps({"instances": [{"a": 1, "b": 0}]}).encode(),
     "Unrecognized servable version label: stable"),
])
def test_bad_rest_requests_are_a_400_never_a_500(server: Server, path: str, body: bytes, message: str) -> None:
    status, answer = http("POST", server.url(path), raw=body)
    assert status == 400 and message in answer["error"], answer
    status, _ = http("GET", server.url("/v1/models/tiny/labels/stable"))
    assert status == 400
    # a string that merely contains "true" and brackets is still a number-free, valid request
    status, answer = http("POST", server.url("/v1/models/tiny:predict"),
                          {"instances": [{"a": 1.0, "b": 0.0}], "signature_name": "serving_default"})
    assert status == 200


def raw_connection(server: Server, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.rest_port), timeout=10)
    sock.sendall(data)
    return sock


def closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_slow_clients_are_cut_off_and_do_not_block_others(server: Server) -> None:
    slow = [raw_connection(server, b"POST /v1/mod") for _ in range(200)]  # half a request line each
    try:
        started = time.monotonic()
        status, answer = http("POST", server.url("/v1/models/tiny:predict"), {"instances": [{"a": 2.0, "b": 0.0}]})
        assert status == 200 and time.monotonic() - started < 5
        assert all(closed_by_server(sock, within=5) for sock in slow)  # header timeout: 1 s
    finally:
        for sock in slow:
            sock.close()


def test_a_body_shorter_than_its_content_length_is_never_processed(server: Server) -> None:
    head = b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    waiting = raw_connection(server, head + b'{"instances": [')
    assert closed_by_server(waiting, within=5)  # still open, body never completes: closed after the body timeout
    half = raw_connection(server, head + b'{"instances": [{"a": 1, "b": 0}]}')
    half.shutdown(socket.SHUT_WR)  # the client is done sending: 33 of 100 bytes
    answer = b"".join(iter(lambda: half.recv(65536), b"")).decode()  # the server answers, then closes
    assert answer.startswith("HTTP/1.1 400") and "the body ended after 33 of the 100 bytes" in answer
    half.close()


def test_past_the_connection_limit_a_client_gets_503_at_once(models: Path, tmp_path: Path) -> None:
    capped = Server(models, "--max-connections", "4", "--header-timeout", "30").start(tmp_path / "capped.log")
    try:
        idle = [raw_connection(capped, b"") for _ in range(4)]
        time.sleep(0.5)  # accepted: each holds a slot
        status, answer = http("GET", capped.url("/v1/models/tiny"))
        assert status == 503 and "too many connections (limit 4)" in answer["error"]
        for sock in idle:
            sock.close()
        time.sleep(0.5)
        assert http("GET", capped.url("/v1/models/tiny"))[0] == 200
    finally:
        capped.stop()


def test_the_listen_backlog_absorbs_bursts(server: Server) -> None:
    out = subprocess.run(["ss", "-ltnH", f"sport = :{server.rest_port}"], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "LISTEN" and int(out[2]) == 128  # Send-Q of a listener is its backlog (Python's default: 5)


def test_clients_that_leave_early_leave_no_tracebacks(server: Server) -> None:
    body = json.dumps({"instances": [{"a": 1.0, "b": 0.0}] * 2000}).encode()
    head = f"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    for _ in range(30):
        sock = raw_connection(server, head + body)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # reset before the answer is written
    time.sleep(2)
    log = server.log.read_text()
    assert "Traceback" not in log and "BrokenPipe" not in log and "ConnectionReset" not in log


def test_a_restart_over_broken_newest_versions_serves_the_last_good_one_at_once(tmp_path: Path) -> None:
    root = tmp_path / layout.MODELS
    export_tiny_model(root / "tiny" / "1")
    for version in range(2, 6):
        shutil.copytree(root / "tiny" / "1", root / "tiny" / str(version))
        (root / "tiny" / str(version) / layout.SAVED_MODEL_PB).write_bytes(b"broken")
    restarted = Server(root, "--poll-seconds", "30").start(tmp_path / "restart.log")  # no second poll in time
    try:
        status, answer = http("POST", restarted.url("/v1/models/tiny:predict"), {"instances": [{"a": 2, "b": 0}]})
        assert status == 200 and answer["predictions"][0]["class_ids"] == 0
        states = {s["version"]: s["state"] for s in http("GET", restarted.url("/v1/models/tiny"))[1][
            "model_version_status"]}
        assert states == {"1": "AVAILABLE", "2": "END", "3": "END", "4": "END", "5": "END"}
    finally:
        restarted.stop()


def test_the_server_stays_up_under_concurrent_abuse(server: Server) -> None:
    """All of the above at once, bounded: the server answers a normal predict afterwards."""
    def abuse(i: int) -> None:
        try:
            if i % 3 == 0:
                http("POST", server.url("/v1/models/tiny:predict"), raw=b"[" * 5000)
            elif i % 3 == 1:
                stub(server).Predict(request_with(a=declared([1 << 30]), b=declared([2])), timeout=10)
            else:
                raw_connection(server, b"GET /v1/models/tiny HTTP/1.1\r\n").close()
        except (grpc.RpcError, OSError):
            pass

    threads = [threading.Thread(target=abuse, args=(i,)) for i in range(60)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert http("POST", server.url("/v1/models/tiny:predict"), {"instances": [{"a": 2.0, "b": 0.0}]})[0] == 200
    assert server.process.poll() is None and os.path.exists(f"/proc/{server.process.pid}")


def test_json_depth_ignores_brackets_inside_strings_when_it_matters() -> None:
    from trainyard_serving.rest import json_depth

    assert json_depth(b'{"instances": [{"text": "[[[[[[[[[["}]}', 4) == 3  # a bracket-heavy value is fine
    assert json_depth(b"[" * 100 + b"]" * 100, 64) == 100
    assert json_depth(b'[[["]]]"]]]', 64) == 3 and json_depth(b"", 64) == 0
