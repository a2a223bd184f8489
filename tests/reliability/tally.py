"""Counts the reliability tests report in pytest's terminal summary (see conftest.py): what was tried, what held."""

from __future__ import annotations

from collections import Counter

__all__ = ["TALLY"]

# name -> count; tests add to it, pytest_terminal_summary prints it
TALLY: Counter[str] = Counter()
