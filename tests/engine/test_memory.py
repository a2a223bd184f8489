"""The engine's malloc settings hand a batch's large blocks back to the kernel as soon as they are freed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# twice: glibc's default threshold rises to a freed mapped block's size, so the second block comes from the heap
_PROBE = textwrap.dedent(
    """
    import sys
    import numpy as np
    from streamer.engine.memory import configure_malloc

    def rss_mb():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

    if sys.argv[1] == "configured":
        assert configure_malloc()
    before = rss_mb()
    for _ in range(2):
        block = np.ones(16 * 2**20 // 8)  # 16 MiB, every page touched
        del block
    print(rss_mb() - before)
    """
)


def _kept_mb(mode: str) -> float:
    run = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True, timeout=60)
    return float(run.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc")
def test_a_freed_large_block_leaves_resident_memory_only_when_configured() -> None:
    assert _kept_mb("default") > 12  # the heap keeps the second 16 MiB block's pages
    assert _kept_mb("configured") < 4  # its own mapping, unmapped when freed
