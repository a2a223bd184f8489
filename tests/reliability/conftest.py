"""The reliability suite: protocol violations, malformed input, fuzzing, load and faults (``-m reliability``).

Everything runs in-process on the scripted engine over loopback sockets. The counts the tests add to
:data:`tests.reliability.tally.TALLY` are printed in the terminal summary; the helpers the tests share are in
:mod:`tests.reliability.helpers`.
"""

from __future__ import annotations

from typing import Any

from tests.reliability.tally import TALLY


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TALLY:
        return
    terminalreporter.section("reliability counts")
    for name, count in sorted(TALLY.items()):
        terminalreporter.write_line(f"{name}: {count}")
