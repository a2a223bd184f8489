"""The process's event loop (:mod:`streamer.cli.event_loop`): the coroutine's result, on uvloop where installed."""

from __future__ import annotations

import asyncio
import importlib.util

from streamer.cli.event_loop import run_event_loop


def test_the_coroutine_runs_to_its_result_on_uvloop_when_installed() -> None:
    async def main() -> str:
        return type(asyncio.get_running_loop()).__module__

    module = run_event_loop(main())
    assert module.startswith("uvloop") == (importlib.util.find_spec("uvloop") is not None), module
