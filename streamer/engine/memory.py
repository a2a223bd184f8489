"""Keeping a long-running engine's resident memory flat (glibc only; a no-op elsewhere).

Every batch allocates and frees activations, logits and caches of tens of megabytes. glibc keeps freed heap memory
for reuse and gives each thread that allocates (torch's OpenMP workers included) an arena of its own, so a server's
resident size ratchets up to its worst batch ever, times the arenas. Three measures, the first two set before the
model loads: few arenas; a fixed mmap threshold, so that the large blocks (logits, cross-attention keys and values,
caches) are mapped on their own and unmapped when freed, instead of fragmenting the heap within a batch; and
``malloc_trim`` after each batch, which hands free pages back to the kernel (well under a millisecond).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["MMAP_THRESHOLD", "configure_malloc", "release_free_memory", "upload"]

log = logging.getLogger(__name__)

_M_ARENA_MAX = -8  # mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3

# blocks at least this large get their own mapping. glibc's default threshold starts at 128 KiB but rises to the
# largest block ever freed (32 MiB at most), after which a batch's logits and caches are carved from the heap and
# its free space ends up scattered between live blocks until the batch ends. Measured replaying 232 recorded
# streaming windows in batches of 3 (tiny.en, 2 cores): the batch's peak above the idle engine, worst case, went
# from 151 to 131 MB at 4 MiB (1 MiB: 126 MB, but a quarter slower: every mapped block is faulted in anew).
MMAP_THRESHOLD = 4 * 1024 * 1024


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


def configure_malloc(arenas: int = 2, mmap_threshold: int = MMAP_THRESHOLD) -> bool:
    """Cap glibc's malloc arenas and fix its mmap threshold (call before threads start allocating); returns whether
    both applied (False off glibc)."""
    libc = _glibc()
    if libc is None:
        return False
    applied = [bool(libc.mallopt(_M_ARENA_MAX, arenas)), bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold))]
    return all(applied)  # each is set even if the other is refused


def release_free_memory() -> bool:
    """Return free heap pages to the kernel; returns whether anything was released."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def upload(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``: to a GPU from page-locked memory, without waiting for the copy (nor for the
    work queued before it); elsewhere an ordinary copy (none on the CPU)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
