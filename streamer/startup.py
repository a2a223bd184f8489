"""A model-loading process's start-up: Python's cyclic garbage collector paused until the model is ready.

Importing torch and building the network make about a million objects that live as long as the process, and the
collector traced them all three times over on the way: 0.2 s of a 2.3 s ``streamer transcribe`` of one 15 s file
(measured with ``gc.callbacks`` on 2 cores). :func:`pause_collection` runs first thing in a command that loads a
model (``streamer.cli.main.entry``); :func:`resume_collection`, once the engine is loaded
(:func:`streamer.engine.load_engine`), freezes what start-up made, so no later collection traces it again either (a
server's periodic full collections included), and turns the collector back on.

This module imports nothing heavy, so that the pause comes before torch's import.
"""

from __future__ import annotations

import gc

__all__ = ["pause_collection", "resume_collection"]

_paused = False  # pause_collection turned the collector off and resume_collection has not turned it back on


def pause_collection() -> None:
    """Turn the collector off until :func:`resume_collection`; one that is already off stays as it is."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_collection() -> bool:
    """If :func:`pause_collection` turned the collector off: freeze every object alive now (the permanent generation,
    which collections skip) and turn it back on. Returns whether it did."""
    global _paused
    if not _paused:
        return False
    gc.freeze()
    gc.enable()
    _paused = False
    return True
