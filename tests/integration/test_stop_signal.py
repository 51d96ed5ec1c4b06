"""A stage process that is its container's PID 1 stops on SIGTERM.

The kernel drops a signal whose handler is the default for PID 1, which every stage process is in its pod: on the
real cluster a deleted parameter-server pod ran out its 30 s grace, and a chief whose job had already failed kept
training and wrote checkpoints into the run folder. Here the real parameter-server loop runs as PID 1 of a new PID
namespace (`unshare --pid --fork`, as a container runtime starts it) and must exit 143 soon after SIGTERM.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PS_AS_PID_1 = """
import os, sys
from types import SimpleNamespace
from trainyard_contract.runtime import exit_on_sigterm, setup_logging
from trainyard_trainer.__main__ import serve_forever
assert os.getpid() == 1, os.getpid()
setup_logging()
exit_on_sigterm()
port = int(sys.argv[1])
serve_forever(SimpleNamespace(cluster={"ps": [f"127.0.0.1:{port}"], "chief": ["127.0.0.1:1"]}, role="ps", index=0))
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="a new PID namespace needs root and util-linux's unshare")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_parameter_server_running_as_pid_1_exits_on_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "images" / "trainer"),
                                                        os.environ.get("PYTHONPATH", "")]),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    log = tmp_path / "ps.log"
    with log.open("w") as out:
        # --kill-child: unshare's own child (our PID 1) gets SIGKILL if unshare dies, so nothing is left behind
        process = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", PS_AS_PID_1,
                                    str(free_port())], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while "serving on" not in log.read_text():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the parameter server did not start in 120 s:\n" + log.read_text()
            time.sleep(0.2)
        inner = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
        assert len(inner) == 1, inner  # PID 1 of the namespace, seen from here
        sent = time.monotonic()
        os.kill(int(inner[0]), signal.SIGTERM)  # what the kubelet sends a deleted pod's PID 1
        code = process.wait(timeout=10)
        assert time.monotonic() - sent < 10
        assert code == 143, (code, log.read_text())  # unshare passes on its child's status: 128 + SIGTERM
        assert "SIGTERM: stopping now" in log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
