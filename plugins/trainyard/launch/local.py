"""The local backend: runs a stage's container as a local process over a local folder standing in for the volume.

It takes the same `ContainerSpec` the Kubernetes backend builds its pods from, and maps it explicitly: the image's
`python -m <module>` becomes this venv's interpreter (images.py); the shared volume's mount path
(`kubernetes.volume.mount_path`) becomes `TRAINYARD_DATA_DIR`; the `/airflow/xcom` and scratch folders a pod gets
as emptyDirs become temporary folders under `$TMPDIR/trainyard-work-<uid>/`, named after the process that owns
them, so a `trainyard run` killed with SIGKILL (which cannot clean up) leaves nothing for long: the next one
removes folders whose owner is gone. Env values come from the container spec (a `kubernetes.secrets` variable is
read from the same-named local variable, since a laptop has no Secrets). The output streams into the task log
line by line, and the return.json the process wrote is the task's XCom, as with KubernetesPodOperator.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from trainyard import settings
from trainyard.dag.cluster_spec import ROLES, Replicas, local_hosts
from trainyard.dag.registry import Stage
from trainyard.dag.registry import images as registry_images
from trainyard.dag.stages import ContainerSpec, RunContext
from trainyard.launch.base import StageFailed
from trainyard.launch.images import local_command
from trainyard.launch.native_noise import is_native_noise
from trainyard.launch.podspec import SCRATCH_PATH, replica_name, stage_pod_name
from trainyard.launch.replica_policy import Action, on_replica_exit
from trainyard_contract import layout
from trainyard_contract.runtime import XCOM_DIR, XCOM_RETURN, CauseTracker, failure_cause
from trainyard_contract.schema import PipelineConfig

TAIL_LINES = 40
STOP_GRACE_SECONDS = 10.0


def work_root() -> Path:
    return Path(tempfile.gettempdir()) / f"trainyard-work-{os.getuid()}"


def alive(pid: int) -> bool:
    """Whether process `pid` exists (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_orphaned_work(root: Path) -> list[str]:
    """Delete work folders (`<kind>-<pid>-<random>`) whose owning process is gone (a SIGKILLed run)."""
    removed = []
    for child in sorted(root.iterdir()) if root.is_dir() else []:
        parts = child.name.split("-")
        if len(parts) >= 3 and parts[1].isdigit() and int(parts[1]) != os.getpid() and not alive(int(parts[1])):
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child.name)
    return removed


@contextlib.contextmanager
def work_folder(kind: str) -> Iterator[Path]:
    """A private temporary folder for one pod or job, removed when it ends (and by the next one if this process
    is killed before it can)."""
    root = work_root()
    root.mkdir(mode=0o700, exist_ok=True)
    remove_orphaned_work(root)
    path = Path(tempfile.mkdtemp(prefix=f"{kind}-{os.getpid()}-", dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class PathMapper:
    """Rewrites container paths (an exact mount path or anything below it) to local folders."""

    def __init__(self, mounts: dict[str, Path]):
        # Longest first, so /data/x maps before /data.
        self._mounts = sorted(mounts.items(), key=lambda item: len(item[0]), reverse=True)

    def __call__(self, value: str) -> str:
        for container_path, local in self._mounts:
            if value == container_path:
                return str(local)
            if value.startswith(container_path.rstrip("/") + "/"):
                return str(local / value[len(container_path.rstrip("/")) + 1 :])
        return value


def _env_for(spec: ContainerSpec, mapper: PathMapper) -> dict[str, str]:
    """This process's environment with the container's over it (paths mapped). A `kubernetes.secrets` variable
    is whatever the same-named local variable holds, or unset: a laptop has no Secrets."""
    env = dict(os.environ)
    env.update((name, mapper(value)) for name, value in spec.env.items())
    return env


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when the process that started it dies (Linux's PDEATHSIG), so a
    killed `trainyard run` or Airflow worker leaves no stage or replica running on its own."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: stop() and on_kill still end the process


class LocalProcess:
    """One running pod-as-process: started in its own session so it can be stopped with all its children."""

    def __init__(self, name: str, spec: ContainerSpec, volume: tuple[str, Path], work_dir: Path,
                 images: Mapping[str, str]):
        """`volume`: the shared volume's mount path in the container, and the local folder that stands for it."""
        self.name = name
        self.role = spec.role
        self.stage = spec.stage
        mount_path, data_dir = volume
        mounts: dict[str, Path] = {XCOM_DIR: work_dir / "xcom", SCRATCH_PATH: work_dir / "scratch",
                                   mount_path: data_dir}
        for local in mounts.values():
            local.mkdir(parents=True, exist_ok=True)
        mapper = PathMapper(mounts)
        self.map_path = mapper
        self.xcom_file = Path(mapper(XCOM_RETURN))
        self.argv = local_command(spec.image, list(spec.command), images) + [mapper(a) for a in spec.args]
        self.env = _env_for(spec, mapper)
        self.env["TMPDIR"] = str(work_dir / "scratch")
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.cause = CauseTracker()  # the stage's own error, however far above the tail it was printed
        self.process: subprocess.Popen[str] | None = None
        self.output: Path | None = None

    def start(self, output: Path | None = None) -> None:
        """Start the process; its output is piped (to stream) or appended to `output` (a replica's log file)."""
        self.output = output
        sink = output.open("a") if output is not None else subprocess.PIPE
        try:
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                start_new_session=True,  # its own process group: stop() ends it with all its children
                preexec_fn=die_with_parent,
            )
        finally:
            if output is not None:
                sink.close()

    def log_tail(self, lines: int = 15) -> list[str]:
        """The last lines of its output, without TensorFlow's start-up chatter (the log file keeps every line)."""
        if self.output is None or not self.output.is_file():
            return list(self.tail)[-lines:]
        text = self.output.read_text(errors="replace").splitlines()
        return [line for line in text if not is_native_noise(line)][-lines:]

    def stream(self, log: logging.Logger, prefix: str) -> int:
        """Copy output lines to `log` until the process exits (TensorFlow's start-up chatter left out); return
        its exit code."""
        if self.process is None or self.process.stdout is None:
            raise RuntimeError(f"process for {self.name} was not started")
        for line in self.process.stdout:
            line = line.rstrip("\n")
            if is_native_noise(line):
                continue
            self.tail.append(line)
            self.cause.feed(line)
            log.info("%s %s", prefix, line)
        return self.process.wait()

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL after a grace period; always reaps."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        except ProcessLookupError:
            process.wait()

    def read_xcom(self) -> dict[str, Any] | None:
        if not self.xcom_file.is_file():
            return None
        return json.loads(self.xcom_file.read_text())


def replica_cause(proc: LocalProcess | None) -> str | None:
    """The cause a replica that failed the job printed, read from its whole log file."""
    if proc is None or proc.output is None or not proc.output.is_file():
        return None
    with proc.output.open(errors="replace") as lines:
        return failure_cause(lines)


class LocalLauncher:
    """Runs pods as local processes; `kill()` (from on_kill, any thread) stops every process it started."""

    def __init__(self, config: PipelineConfig, data_dir: Path | None = None, images: Mapping[str, str] | None = None):
        self.config = config
        self.data_dir = data_dir or settings.data_dir()
        self.images = dict(images if images is not None else registry_images())
        self._running: list[LocalProcess] = []
        self._lock = threading.Lock()

    @property
    def volume(self) -> tuple[str, Path]:
        """The volume's mount path in the containers, and the folder that stands for it here."""
        return self.config.kubernetes.volume.mount_path, self.data_dir

    def run_stage(self, run: RunContext, spec: ContainerSpec, log: logging.Logger,
                  context: Any = None) -> dict[str, Any] | None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with work_folder("pod") as work:
            proc = LocalProcess(stage_pod_name(self.config, run, spec), spec, self.volume, work, self.images)
            log.info("local backend: running pod %s: %s", proc.name, " ".join(proc.argv))
            with self._lock:
                self._running.append(proc)
            try:
                proc.start()
                code = proc.stream(log, f"[{proc.stage}]")
            finally:
                proc.stop()
                with self._lock:
                    self._running.remove(proc)
            if code != 0:
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                tail = "\n".join(f"    {line}" for line in proc.tail)
                raise StageFailed(f"pod {proc.name} {how}; last {len(proc.tail)} lines of its output:\n{tail}", code,
                                  cause=proc.cause.cause)
            return proc.read_xcom()

    def kill(self) -> None:
        with self._lock:
            running = list(self._running)
        for proc in running:
            proc.stop()

    def ensure_serving(self, config: PipelineConfig, log: logging.Logger) -> str:
        """The local TF Serving API server, which `trainyard serve` starts (nothing to create here)."""
        return settings.local_serving_grpc(config.deploy.grpc_port)

    def cluster_hosts(self, job: str, namespace: str, port: int, replicas: Replicas) -> dict[str, list[str]]:
        """Free 127.0.0.1 ports, chosen now, one per replica."""
        return local_hosts({role: [free_port() for _ in range(replicas.count(role))] for role in ROLES})

    def run_job(self, run: RunContext, stage: Stage, specs: list[ContainerSpec],
                log: logging.Logger) -> dict[str, Any] | None:
        """Run a training job: PS and workers first, then the chief; the job's result is the chief's. Each
        replica's output goes to `<run>/logs/cluster/<job>-<role>-<i>.log` on the volume.

        Local ports need no Service. A worker that exits is restarted in place (same
        port, same TF_CONFIG) while the restart budget lasts; a parameter server that exits fails the attempt at
        once (the retry resumes from the last checkpoint).
        When the chief ends, for any reason, every other replica is stopped and reaped.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        restart_budget = self.config.training.restart_budget
        with work_folder("job") as work:
            names = [replica_name(run.job_name, spec) for spec in specs]
            procs = [LocalProcess(name, spec, self.volume, work / name, self.images)
                     for name, spec in zip(names, specs, strict=True)]
            chief = next(p for p in procs if p.role == "chief")
            others = [p for p in procs if p is not chief]
            log_folder = run.layout(self.data_dir).path(layout.CLUSTER_LOGS)
            log_folder.mkdir(parents=True, exist_ok=True)
            with self._lock:
                self._running.extend(procs)
            monitor = JobMonitor(others, restart_budget, log, on_fatal=chief.stop)
            try:
                for proc in others:
                    proc.start(output=log_folder / f"{proc.name}.log")
                    log.info("local backend: started %s (%s), log %s", proc.name, proc.role, proc.output)
                chief.start()
                monitor.start()
                code = chief.stream(log, "[chief]")
            finally:
                monitor.stop()
                for proc in procs:
                    proc.stop()
                with self._lock:
                    for proc in procs:
                        self._running.remove(proc)
            if monitor.fatal is not None or code != 0:
                reason = monitor.fatal or (f"chief was killed by signal {-code}" if code < 0
                                           else f"chief exited with code {code}")
                sections = ["--- chief (last lines) ---", *list(chief.tail)[-20:]]
                for proc in others:
                    sections += [f"--- {proc.name} (last lines, full log: {proc.output}) ---", *proc.log_tail()]
                cause = chief.cause.cause if monitor.fatal is None else replica_cause(monitor.fatal_proc)
                raise StageFailed(f"training job failed: {reason}\n" + "\n".join(sections),
                                  code if monitor.fatal is None else monitor.fatal_code, cause=cause)
            log.info("training job finished; worker restarts: %d", monitor.restarts)
            result = chief.read_xcom()
            if result is not None:
                result["worker_restarts"] = monitor.restarts
            return result


    def cleanup_job(self, selector: dict[str, str], service: str, log: logging.Logger) -> int:
        """Nothing to sweep: replica processes are the training task's children, stopped when it ends."""
        log.info("local backend: no pods to clean up for %s", service)
        return 0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class JobMonitor(threading.Thread):
    """Watches PS and workers while the chief runs: restarts lost workers in place, fails fast on a lost PS."""

    POLL_SECONDS = 0.5

    def __init__(self, replicas: list[LocalProcess], budget: int, log: logging.Logger,
                 on_fatal: Callable[[], None]):
        super().__init__(name="trainyard-job-monitor", daemon=True)
        self.replicas, self.budget, self.log, self.on_fatal = replicas, budget, log, on_fatal
        self.restarts = 0
        self.fatal: str | None = None
        self.fatal_code: int | None = None
        self.fatal_proc: LocalProcess | None = None
        self._finished: set[str] = set()
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self.POLL_SECONDS):
            for proc in self.replicas:
                code = proc.process.poll() if proc.process else None
                if code is None or self._stopping.is_set() or proc.name in self._finished:
                    continue
                verdict = on_replica_exit(proc.role, code, self.restarts, self.budget)
                if verdict.action is Action.FINISHED:
                    self._finished.add(proc.name)
                elif verdict.action is Action.RESTART:
                    self.restarts += 1
                    self.log.warning("%s %s", proc.name, verdict.reason)
                    proc.start(output=proc.output)
                else:
                    self.fatal, self.fatal_code, self.fatal_proc = f"{proc.name} {verdict.reason}", code, proc
                    self.log.error("%s; stopping the job", self.fatal)
                    self.on_fatal()
                    return

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(timeout=5)
