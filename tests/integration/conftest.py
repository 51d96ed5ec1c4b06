"""Fixtures the end-to-end tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.serving_helpers import Server
from tests.integration.stream_helpers import RedisServer
from trainyard_contract import layout


@pytest.fixture
def serving(data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """The local server over the test volume's models/, on free ports; the deploy step finds it by env."""
    (data_dir / layout.MODELS).mkdir()
    server = Server(data_dir / layout.MODELS).start(tmp_path / "serving.log")
    monkeypatch.setenv("TRAINYARD_SERVING_GRPC", server.grpc)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """A real redis-server on a free 127.0.0.1 port for one test module (the stream tests, the operating tests)."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()
