"""TensorFlow's C++ start-up chatter, kept out of the task logs (the stage's own lines and real warnings stay).

Every TensorFlow process prints the same lines before it does anything: absl's "before InitializeLog" notice, the
oneDNN and CPU-feature notes, and on a machine without GPUs `cudart_stub` / `cuInit` lines. TF_CPP_MIN_LOG_LEVEL
no longer silences them (absl writes everything to stderr before its logging is initialised), so the launchers
drop exactly these lines where they copy a stage's output into the task log: the local backend's stream, the
Kubernetes job's chief follower, and KubernetesPodOperator's pod-log lines (`kubernetes_stage.QuietPodManager`).
The raw output is untouched: replica log files and pod logs keep every line, crash output included.
"""

from __future__ import annotations

import re

_GLOG = r"[IWE]\d{4} \d\d:\d\d:[\d.]+\s+\d+ "  # the glog/absl prefix: severity, date, time, thread
NATIVE_NOISE = re.compile(
    r"^(?:"
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rf"|{_GLOG}(?:port|cpu_feature_guard|cudart_stub)\.cc:\d+\] "
    rf"|{_GLOG}cuda_(?:platform|executor|diagnostics)\.cc:\d+\] "
    r"(?:failed call to cuInit|retrieving CUDA diagnostic|hostname|libcuda reported version|kernel driver)"
    r"|To enable the following instructions: .*, in other operations, rebuild TensorFlow"
    r")"
)


def is_native_noise(line: str) -> bool:
    """Whether `line` is one of TensorFlow's start-up lines (not a warning or error about the work itself)."""
    return NATIVE_NOISE.match(line) is not None
