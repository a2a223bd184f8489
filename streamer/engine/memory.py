"""Keeping a long-running engine's resident memory flat (glibc only; a no-op elsewhere).

Every batch allocates and frees activations, logits and caches of tens of megabytes. glibc keeps freed heap memory
for reuse and gives each thread that allocates (torch's OpenMP workers included) an arena of its own, so a server's
resident size ratchets up to its worst batch ever, times the arenas. Two measures: few arenas, set before the model
loads; and ``malloc_trim`` after each batch, which hands free pages back to the kernel (well under a millisecond).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from functools import lru_cache
from typing import Any

__all__ = ["limit_arenas", "release_free_memory"]

log = logging.getLogger(__name__)

_M_ARENA_MAX = -8  # mallopt parameter (malloc.h)


@lru_cache(maxsize=1)
def _glibc() -> Any | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018  # only glibc has it
        return libc
    except (OSError, AttributeError):
        return None


def limit_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas (call before threads start allocating); returns whether it applied."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_ARENA_MAX, arenas))


def release_free_memory() -> bool:
    """Return free heap pages to the kernel; returns whether anything was released."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
