"""A stage process stops on SIGTERM: as its container's PID 1, and whichever of its threads the signal lands on.

The kernel drops a signal whose handler is the default for PID 1, which every stage process is in its pod: on the
real cluster a deleted parameter-server pod ran out its 30 s grace, and a chief whose job had already failed kept
training and wrote checkpoints into the run folder. Here the real parameter-server loop runs as PID 1 of a new PID
namespace (`unshare --pid --fork`, as a container runtime starts it) and must exit 143 soon after SIGTERM.

The kernel also gives a process's signal to any of its threads, and Python runs its handler only when the main
thread next runs Python code: on CI the parameter server above once slept on through SIGTERM because one of gRPC's
threads had taken it. The second test sends the signal to a thread that is not the main one, every time.
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

SIGTERM_ON_ANOTHER_THREAD = """
import signal, threading, time
from trainyard_contract.runtime import exit_on_sigterm, setup_logging
setup_logging()
exit_on_sigterm()

def take_the_signal():
    print("signalling a thread that is not the main one", flush=True)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # the kernel's choice, made for it
    time.sleep(3600)

threading.Thread(target=take_the_signal, daemon=True).start()
time.sleep(3600)  # the main thread never runs Python code again by itself
"""
SIGTERM_IN_A_FORKED_CHILD = """
import os, signal
from trainyard_contract.runtime import exit_on_sigterm, setup_logging
setup_logging()
exit_on_sigterm()
child = os.fork()
if child == 0:
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pause()
_, status = os.waitpid(child, 0)
print("child exit", os.waitstatus_to_exitcode(status), "parent still here", flush=True)
"""
needs_pid_namespace = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                         reason="a new PID namespace needs root and util-linux's unshare")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stage_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "images" / "trainer"),
                                                         os.environ.get("PYTHONPATH", "")]),
            "TF_CPP_MIN_LOG_LEVEL": "2"}


@needs_pid_namespace
def test_a_parameter_server_running_as_pid_1_exits_on_sigterm(tmp_path: Path) -> None:
    env = stage_env()
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


def test_sigterm_taken_by_another_thread_stops_a_process_whose_main_thread_sleeps() -> None:
    done = subprocess.run([sys.executable, "-c", SIGTERM_ON_ANOTHER_THREAD], capture_output=True, text=True,
                          env=stage_env(), timeout=30)
    assert done.returncode == 143, (done.returncode, done.stdout, done.stderr)
    assert "SIGTERM: stopping now" in done.stderr + done.stdout


def test_sigterm_in_a_forked_child_stops_the_child_not_its_parent() -> None:
    done = subprocess.run([sys.executable, "-c", SIGTERM_IN_A_FORKED_CHILD], capture_output=True, text=True,
                          env=stage_env(), timeout=30)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert "child exit 143 parent still here" in done.stdout, (done.stdout, done.stderr)
