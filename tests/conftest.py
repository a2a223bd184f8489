"""Shared fixtures. The real model loads once per test session (``tiny_engine``); data comes from ``tests/data``
(committed clips) or ``../shared/data`` (larger material, skipped with a reason when absent)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pytest

if TYPE_CHECKING:
    from streamer.engine.whisper import WhisperEngine
    from streamer.server.serve import Server
    from tests.redis_server import RedisProcess

TESTS = Path(__file__).parent
DATA = TESTS / "data"
SHARED_DATA = TESTS.parent.parent / "shared" / "data"

# The committed clips and their reference transcripts (LibriSpeech test-clean, CC BY 4.0; see tests/data/README.md).
CLIPS = {
    line.split("\t")[0]: line.split("\t")[1]
    for line in (DATA / "transcripts.tsv").read_text(encoding="utf-8").splitlines()[1:]
    if "\t" in line
}


def load_clip(name: str) -> npt.NDArray[np.float32]:
    """A committed clip as float32 mono 16 kHz samples."""
    import soundfile as sf

    samples, rate = sf.read(DATA / name, dtype="float32")
    assert rate == 16000
    return np.asarray(samples, dtype=np.float32)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent (it sits beside the checkout on the project's machines)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_engine() -> Iterator[WhisperEngine]:
    """The real tiny.en model with the CPU defaults (INT8 encoder, FP32 decoder), loaded once."""
    from streamer.engine import load_engine

    engine = load_engine("tiny.en")
    yield engine
    engine.close()


# -- Redis: a real redis-server (Debian's package; .ci/run installs it) -------------------------------------------

_NO_REDIS = "redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)"


@pytest.fixture(scope="session")
def redis_session_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    from tests.redis_server import REDIS_SERVER, RedisProcess

    if REDIS_SERVER is None:
        pytest.skip(_NO_REDIS)
    process = RedisProcess(tmp_path_factory.mktemp("redis"))
    process.start()
    yield process
    process.stop()


@pytest.fixture
def redis_url(redis_session_server: RedisProcess) -> str:
    """The URL of a redis-server shared by the test session, emptied for this test."""
    assert redis_session_server.command("FLUSHALL").startswith(b"+OK")
    return redis_session_server.url


@pytest.fixture
def redis_process(tmp_path: Path) -> Iterator[RedisProcess]:
    """A redis-server of this test's own, running: the test may stop, restart or pause it."""
    from tests.redis_server import REDIS_SERVER, RedisProcess

    if REDIS_SERVER is None:
        pytest.skip(_NO_REDIS)
    process = RedisProcess(tmp_path)
    process.start()
    yield process
    process.stop()


@pytest.fixture(params=["in-process", "redis"])
def shared(request: pytest.FixtureRequest) -> str | None:
    """Each implementation of the shared state in turn (uvicorn's seams-as-fixtures): None for the in-process one
    (no ``--redis``), else the URL of a real, empty redis-server. Servers built with ``tests.helpers.config(redis=...)``
    and the stores built from it share state through it, as replicas do."""
    if request.param == "in-process":
        return None
    url: str = request.getfixturevalue("redis_url")
    return url


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    """A server on a free port with the default options and the scripted engine (``tests.helpers.WORDS``)."""
    # imported here: tests.helpers imports this module (load_clip), and the engine tests need no server
    from streamer.app import App
    from streamer.engine.fake import ScriptedEngine
    from tests.helpers import WORDS, config

    async with App(config(), ScriptedEngine(WORDS)) as srv:
        yield srv
