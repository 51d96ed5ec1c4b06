"""Reading the Kubernetes API as it really answers: line streams, timestamps, Status bodies, retries."""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from kubernetes.client.exceptions import ApiException

from tests.unit.k8s_fakes import api_exception
from trainyard.launch.kubernetes_api import (
    ApiUnavailable,
    api_error,
    as_lines,
    split_timestamp,
    stream_lines,
    with_retries,
)

LOG = logging.getLogger("test.k8s.api")


def test_a_stream_split_mid_line_and_mid_character_gives_whole_lines() -> None:
    text = "step 1 loss 0.5\nstep 2 — loss 0.4\nlast line without newline".encode()
    cut = text.index("—".encode()) + 1  # inside the 3-byte dash
    chunks = [text[:5], text[5:cut], text[cut:], b""]
    assert list(stream_lines(chunks)) == ["step 1 loss 0.5", "step 2 — loss 0.4", "last line without newline"]


def test_log_bodies_of_every_shape() -> None:
    assert as_lines(None) == [] and as_lines(b"a\nb\n") == ["a", "b"] and as_lines("") == []


@pytest.mark.parametrize(("line", "when", "text"), [
    ("2026-12-03T10:00:00.123456789Z step 1", dt.datetime(2026, 12, 3, 10, 0, 0, 123456, tzinfo=dt.UTC), "step 1"),
    ("2026-12-03T10:00:00Z x y", dt.datetime(2026, 12, 3, 10, tzinfo=dt.UTC), "x y"),
    ("no timestamp here", None, "no timestamp here"),
])
def test_split_timestamp(line: str, when: dt.datetime | None, text: str) -> None:
    assert split_timestamp(line) == (when, text)


def test_api_error_reads_the_status_body_not_the_response() -> None:
    assert api_error(api_exception(403, "Forbidden", "exceeded quota: q")) == "403 Forbidden: exceeded quota: q"
    bare = ApiException(status=500, reason="Internal Server Error")
    bare.body = "<html>oops</html>"
    assert api_error(bare) == "500 Internal Server Error: <html>oops</html>"


def test_transient_errors_are_retried_with_backoff_then_reported() -> None:
    waits: list[float] = []
    answers = iter([api_exception(429, "TooManyRequests"), api_exception(503, "ServiceUnavailable"), "ok"])

    def call() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert with_retries(call, "listing pods", LOG, sleep=waits.append) == "ok" and waits == [0.5, 1.0]
    with pytest.raises(ApiUnavailable, match="listing pods: the API server answered 502 BadGateway 3 times"):
        with_retries(lambda: (_ for _ in ()).throw(api_exception(502, "BadGateway")), "listing pods", LOG,
                     retries=2, sleep=waits.append)
    with pytest.raises(ApiException):  # not transient: raised at once
        with_retries(lambda: (_ for _ in ()).throw(api_exception(404, "NotFound")), "x", LOG, sleep=waits.append)
    assert waits == [0.5, 1.0, 0.5, 1.0]
