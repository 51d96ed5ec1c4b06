"""Serving latency, availability and robustness: REST and gRPC predict vs the in-process signature call.

Targets: p99 of each API with 8 concurrent clients <= 3x the in-process p50 + 2 ms; zero failed requests while 20
new versions are published (by the deploy step's own publish()) under that load; REST p99 while 200 slow clients
hold connections open <= 2x the idle p99; server RSS after 20,000 predicts and 20 version swaps within 1.25x of
the RSS before them (no leak); with 8 clients that never read their ~18 MB answers, the server's RSS and open
connections back within 1.1x of idle 5 s after the write timeout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402

from tests.integration.serving_helpers import Server, export_tiny_model  # noqa: E402
from trainyard_contract import layout  # noqa: E402
from trainyard_contract.artifacts import VersionRecord  # noqa: E402
from trainyard_serving.publishing import publish  # noqa: E402

CLIENTS = 8


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000


def rest_call(url: str, body: bytes) -> None:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def load(call, seconds: float, clients: int = CLIENTS) -> tuple[list[float], int]:  # noqa: ANN001
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client() -> None:
        mine = []
        while time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                call()
                mine.append(time.perf_counter() - start)
            except Exception:  # counted, never hidden
                with lock:
                    failures[0] += 1
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, failures[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--slow-readers-only", action="store_true", help="only the slow-reader figures")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        saved = export_tiny_model(root / "export")
        publish(root / layout.MODELS / "tiny", saved, VersionRecord(run_id="bench"))
        if args.slow_readers_only:
            slow_readers(root)
            return 0
        server = Server(root / layout.MODELS).start(root / "server.log")
        try:
            signature = tf.saved_model.load(str(saved)).signatures["serving_default"]
            inputs = {"a": tf.constant([1.0]), "b": tf.constant([0.0])}
            for _ in range(50):
                signature(**inputs)
            local = []
            for _ in range(2000):
                start = time.perf_counter()
                signature(**inputs)
                local.append(time.perf_counter() - start)
            local_p50 = statistics.median(local) * 1000
            target = 3 * local_p50 + 2

            body = json.dumps({"instances": [{"a": 1.0, "b": 0.0}]}).encode()
            url = server.url("/v1/models/tiny:predict")
            channel = grpc.insecure_channel(server.grpc)
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "tiny"
            for name in ("a", "b"):
                request.inputs[name].CopyFrom(tf.make_tensor_proto(np.array([1.0], dtype=np.float32)))

            print(f"serving bench: {CLIENTS} concurrent clients, {args.seconds:.0f} s per API, 2 cores")
            print(f"  in-process signature call: p50 {local_p50:.2f} ms -> target p99 <= {target:.2f} ms")
            for name, call in (("REST", lambda: rest_call(url, body)),
                               ("gRPC", lambda: stub.Predict(request, timeout=10))):
                for clients in (1, CLIENTS):
                    latencies, failures = load(call, args.seconds / 2 if clients == 1 else args.seconds, clients)
                    seconds = args.seconds / 2 if clients == 1 else args.seconds
                    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
                    print(f"  {name}, {clients} client(s): {len(latencies) / seconds:.0f} req/s, p50 {p50:.2f} ms, "
                          f"p99 {p99:.2f} ms ({p99 / target:.2f}x the target), {failures} failed")

            published: list[int] = []

            def publisher() -> None:
                for _ in range(20):
                    published.append(publish(root / layout.MODELS / "tiny", saved, VersionRecord(run_id="bench")))
                    time.sleep(0.4)

            thread = threading.Thread(target=publisher)
            thread.start()
            started = time.monotonic()
            latencies, failures = load(lambda: stub.Predict(request, timeout=10), 12.0)
            rest_lat, rest_fail = load(lambda: rest_call(url, body), 2.0)
            thread.join()
            print(f"  while publishing 20 versions ({published[0]}..{published[-1]}) in "
                  f"{time.monotonic() - started:.1f} s: gRPC {len(latencies)} ok / {failures} failed, "
                  f"REST {len(rest_lat)} ok / {rest_fail} failed (target 0 failed)")
            slow_clients(server, url, body)
            leak_check(server, stub, request, root / layout.MODELS / "tiny", saved)
            channel.close()
        finally:
            server.stop()
        slow_readers(root)
    return 0


def connections(port: int) -> int:
    """Established TCP connections on the server's side of `port`."""
    import subprocess

    out = subprocess.run(["ss", "-tnH", "state", "established", f"sport = :{port}"], capture_output=True, text=True,
                         check=True).stdout
    return len(out.splitlines())


def slow_readers(root: Path, readers: int = 8, rows: int = 280_000, write_timeout: float = 5.0) -> None:
    """Server RSS and open connections: idle (after the same load served to clients that read), while `readers`
    clients sit on ~18 MB answers they never read, and 5 s after the write timeout dropped the last of them (side
    by side, one server)."""
    import socket

    server = Server(root / layout.MODELS, "--max-batch", str(rows), "--max-body-bytes", str(64 << 20),
                    "--write-timeout", str(write_timeout)).start(root / "slow-readers.log")
    try:
        body = json.dumps({"inputs": {"a": [1.0] * rows, "b": [0.0] * rows}}).encode()
        url = server.url("/v1/models/tiny:predict")
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        sizes: list[int] = []

        def read_one() -> None:
            with urllib.request.urlopen(request, timeout=300) as response:
                sizes.append(len(response.read()))

        started = time.monotonic()
        read_one()
        one = time.monotonic() - started
        # the same 8-way load read normally first: TensorFlow keeps per-thread caches after it either way, so idle
        # is the server at rest after serving it to clients that read their answers
        warm = [threading.Thread(target=read_one) for _ in range(readers)]
        for thread in warm:
            thread.start()
        for thread in warm:
            thread.join()
        answer = sizes[0]
        time.sleep(2)
        idle_rss, idle_conns = rss_mib(server.process.pid), connections(server.rest_port)
        head = (f"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
                .encode())
        sockets = []
        started = time.monotonic()
        for _ in range(readers):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", server.rest_port))
            sock.sendall(head + body)
            sockets.append(sock)
        peak_rss, peak_conns, conns = idle_rss, 0, -1
        while time.monotonic() - started < 300:
            time.sleep(0.5)
            conns = connections(server.rest_port)
            peak_rss, peak_conns = max(peak_rss, rss_mib(server.process.pid)), max(peak_conns, conns)
            if conns == 0:
                break
        dropped = time.monotonic() - started
        time.sleep(5)
        after_rss, after_conns = rss_mib(server.process.pid), connections(server.rest_port)
        for sock in sockets:
            sock.close()
        gone = (f"all dropped {dropped:.1f} s after sending" if conns == 0
                else f"{conns} still open {dropped:.0f} s after sending")
        print(f"  {readers} clients not reading {answer / 1e6:.1f} MB answers (one answer takes {one:.1f} s; write "
              f"timeout {write_timeout:g} s): connections {idle_conns} idle, {peak_conns} at most, {gone}, "
              f"{after_conns} 5 s later; RSS idle {idle_rss:.0f} MiB, peak "
              f"{peak_rss:.0f} MiB, 5 s after that {after_rss:.0f} MiB ({after_rss / idle_rss:.2f}x idle; "
              "target <= 1.1x)")
    finally:
        server.stop()


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024


def sequential(call, count: int) -> list[float]:  # noqa: ANN001
    latencies = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - start)
    return latencies


def slow_clients(server: Server, url: str, body: bytes, count: int = 200, requests: int = 400) -> None:
    """REST p99 of one client, idle and then while `count` sockets each hold half a request line (well inside
    the server's header timeout), side by side."""
    import socket

    idle = percentile(sequential(lambda: rest_call(url, body), requests), 99)
    sockets = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", server.rest_port), timeout=5)
            sock.sendall(b"POST /v1/mod")
            sockets.append(sock)
        loaded = percentile(sequential(lambda: rest_call(url, body), requests), 99)
    finally:
        for sock in sockets:
            sock.close()
    print(f"  REST p99 idle {idle:.2f} ms, with {count} slow clients connected {loaded:.2f} ms "
          f"({loaded / idle:.2f}x; target <= 2x)")


def leak_check(server: Server, stub, request, model_dir: Path, saved: Path) -> None:  # noqa: ANN001
    """Server RSS before and after 20,000 gRPC predicts (8 clients) and 20 version swaps."""
    before = rss_mib(server.process.pid)
    done = [0]
    lock = threading.Lock()

    def client() -> None:
        for _ in range(2500):
            stub.Predict(request, timeout=10)
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    for _ in range(20):
        publish(model_dir, saved, VersionRecord(run_id="bench-swap"))
        time.sleep(0.3)
    for thread in threads:
        thread.join()
    time.sleep(2)  # the last swap's old version is released
    after = rss_mib(server.process.pid)
    print(f"  server RSS {before:.0f} MiB before, {after:.0f} MiB after {done[0]} predicts and 20 swaps "
          f"({after / before:.2f}x; target <= 1.25x)")


if __name__ == "__main__":
    sys.exit(main())
