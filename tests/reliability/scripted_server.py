"""``streamer serve`` on the scripted engine, for tests that measure the server from outside its process.

The command is the deployed one, run by ``streamer.cli.main.main`` (its options, uvloop, its signal handling and its
shutdown story), with one change: the model it would load is :class:`~streamer.engine.fake.ScriptedEngine` with
:data:`tests.reliability.helpers.LONG_WORDS`, so that the server is ready in a second and its memory is the server's,
not a model's. The CLI has no option for a fake engine, so this script swaps ``streamer.cli.serve._load_engine`` and
fails loudly if that function is gone (else the real model would load, slowly, in its place).

Run it as ``python tests/reliability/scripted_server.py [streamer serve options]``, under
:func:`streamer.bench.server_process.running_server`. Logging is at INFO (``streamer -v``): tests read the log
for the events they wait on.
"""

from __future__ import annotations

import sys
from pathlib import Path

# the repository root, for tests.reliability.helpers (run as a script, only this file's folder is on the path)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from streamer.cli import serve as server
from streamer.cli.main import main as streamer_main
from streamer.engine.fake import ScriptedEngine
from tests.reliability.helpers import LONG_WORDS

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """``streamer -v serve ARGV`` with the scripted engine in place of the model."""
    if not callable(getattr(server, "_load_engine", None)):
        raise SystemExit("streamer.cli.serve._load_engine is gone: update tests/reliability/scripted_server.py")
    server._load_engine = lambda config: ScriptedEngine(LONG_WORDS)  # type: ignore[attr-defined]
    return streamer_main(["-v", "serve", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
