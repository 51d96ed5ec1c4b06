"""TensorFlow's start-up chatter stays out of task logs; the stage's own lines and real warnings do not."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from trainyard.dag.stages import ContainerSpec, RunContext
from trainyard.launch.local import LocalLauncher
from trainyard.launch.native_noise import is_native_noise
from trainyard_contract.schema import PipelineConfig, Resources

# Seen verbatim in every TensorFlow 2.21 process on a machine without GPUs (CI logs of the training job)
CHATTER = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796320403.270025   15100 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders.",
    "I0000 00:00:1796320403.271128   15100 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will "
    "not be used.",
    "I0000 00:00:1796321456.890964   30149 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    "available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the "
    "appropriate compiler flags.",
    "E0000 00:00:1796320412.643783   15100 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed "
    "call to cuInit: UNKNOWN ERROR (303)",
]
KEPT = [
    "2026-12-03 17:53:32,667 INFO ps 0 serving on grpc://127.0.0.1:50539; it runs until the job stops it",
    "W0000 00:00:1796320412.1 15100 op_kernel.cc:1857] OP_REQUIRES failed at cast_op.cc:122 : UNIMPLEMENTED",
    "E0000 00:00:1796320412.1 15100 cuda_platform.cc:52] CUDA_ERROR_OUT_OF_MEMORY: out of memory",
    "I see port.cc:153] in a sentence",
]


@pytest.mark.parametrize("line", CHATTER)
def test_start_up_chatter_is_recognised(line: str) -> None:
    assert is_native_noise(line)


@pytest.mark.parametrize("line", KEPT)
def test_real_lines_and_real_warnings_are_kept(line: str) -> None:
    assert not is_native_noise(line)


def test_the_local_backend_streams_a_stage_without_the_chatter(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "chatty_stage"
    package.mkdir()
    (package / "__init__.py").write_text("")
    script = "import sys\n" + "".join(f"print({line!r}, file=sys.stderr)\n" for line in CHATTER + KEPT[:1])
    (package / "__main__.py").write_text(script)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    spec = ContainerSpec(stage="chatty", role="main", image="trainyard/chatty:1",
                         command=["python", "-m", "chatty_stage"], args=[], env={}, resources=Resources())
    config = PipelineConfig.model_validate({"name": "chatty", "data": {
        "source": "d", "label": {"name": "y", "classes": [0, 1]}, "features": [{"name": "a"}]}})
    log = logging.getLogger("test.chatty")
    launcher = LocalLauncher(config, tmp_path / "volume", images={"trainyard/chatty": "chatty_stage"})
    with caplog.at_level(logging.INFO, logger=log.name):
        launcher.run_stage(RunContext(pipeline="chatty", run_id="r"), spec, log)
    streamed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[chatty] ")]
    assert streamed == [f"[chatty] {KEPT[0]}"]
