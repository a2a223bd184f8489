"""A model-loading command's start-up: the collector paused until the model is ready, then the start-up's objects
frozen out of later collections (issue 19: 0.2 s of a one-file ``streamer transcribe``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from streamer import startup


@pytest.fixture(autouse=True)
def collector() -> Iterator[None]:
    """Whatever a test does, the collector ends on and nothing frozen, as the suite expects."""
    yield
    startup._paused = False
    gc.unfreeze()
    gc.enable()


def test_a_pause_turns_the_collector_off_and_the_resume_freezes_then_turns_it_on() -> None:
    startup.pause_collection()
    assert not gc.isenabled()
    kept = [object() for _ in range(1000)]  # start-up's objects
    before = gc.get_freeze_count()
    assert startup.resume_collection()
    assert gc.isenabled()
    assert gc.get_freeze_count() >= before + len(kept)  # frozen: later collections skip them
    assert not startup.resume_collection()  # once


def test_without_a_pause_the_resume_leaves_the_collector_as_it_is() -> None:
    assert not startup.resume_collection()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()  # a program that turned it off itself
    startup.pause_collection()  # finds it off: not its pause
    assert not startup.resume_collection()
    assert not gc.isenabled()
