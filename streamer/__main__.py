from __future__ import annotations

from streamer.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
