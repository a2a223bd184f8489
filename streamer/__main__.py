from __future__ import annotations

from streamer.cli.main import entry

if __name__ == "__main__":
    entry()
