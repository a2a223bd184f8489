"""One ``/metrics`` answer for every worker of ``streamer serve --workers N``.

The workers share one listening port, so a Prometheus scrape reaches whichever of them accepts it; each answers with
the metrics of all of them. :func:`merge_expositions` merges the workers' text expositions (format 0.0.4, as
``prometheus_client.generate_latest`` writes them, see :mod:`streamer.server.metrics`) into one, each sample
labelled with the worker it came from. It only rewrites text: collecting the workers' expositions is the caller's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["merge_expositions"]

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# `# HELP name ...` or `# TYPE name ...`; any other comment is dropped
_HEADER = re.compile(r"#[ \t]+(HELP|TYPE)[ \t]+(\S+)")
# One `name="value"` of a label set and what ends it, a comma or the closing brace. The value is skipped, escapes
# and all, only to reach the next label's name: the label is inserted right after the `{`, never among the values.
_LABEL_PAIR = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"(?:[^"\\\n]|\\.)*+"[ \t]*([,}])')
_LABEL_SET_END = re.compile(r"[ \t]*}")


@dataclass
class _Family:
    """One metric family of the merged exposition: its header lines, from the first worker that has each, and the
    samples of every worker, already labelled, in the workers' order."""

    help: str | None = None
    type: str | None = None
    samples: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [line for line in (self.help, self.type) if line is not None] + self.samples


def merge_expositions(texts: Mapping[str, str], label: str = "worker") -> str:
    """texts: worker name -> that worker's exposition text. Returns one exposition: every metric family once, its
    ``# HELP`` and ``# TYPE`` lines taken from the first worker (in the mapping's order) that has it, then the
    samples of that family from every worker in the mapping's order, each with ``label="<worker name>"`` added as
    the FIRST label.

    A family is the block from its ``# HELP``/``# TYPE`` lines to the next family's: every sample in it (``_bucket``,
    ``_count``, ``_sum``, ...) belongs to it whatever its name. Families come out in the order first seen, each
    contiguous, as the format requires. A sample before any header is a family of its own, named by its metric
    name, with no header. Blank lines and comments other than HELP and TYPE are dropped. The result ends with a
    newline, or is ``""`` when there is nothing to write.

    Raises ValueError when ``label`` is not a label name, when a sample already has ``label`` (the merged
    exposition would hold duplicate series), or for a line that is not a sample of the text format."""
    if not _LABEL_NAME.fullmatch(label):
        raise ValueError(f"{label!r} is not a Prometheus label name")
    families: dict[str, _Family] = {}
    for worker, text in texts.items():
        pair = f'{label}="{_escape_label_value(worker)}"'
        current: _Family | None = None
        # split("\n"), not splitlines(): a label value or help text may hold \r, \x0b, \u2028, ... unescaped
        for raw in text.split("\n"):
            line = raw.strip(" \t")
            if not line:
                continue
            if line.startswith("#"):
                header = _HEADER.match(line)
                if header is None:
                    continue
                current = families.setdefault(header[2], _Family())
                if header[1] == "HELP" and current.help is None:
                    current.help = line
                elif header[1] == "TYPE" and current.type is None:
                    current.type = line
                continue
            name, labelled = _insert_label(line, label, pair, worker)
            family = current if current is not None else families.setdefault(name, _Family())
            family.samples.append(labelled)
    lines = [line for family in families.values() for line in family.lines()]
    return "".join(f"{line}\n" for line in lines)


def _escape_label_value(value: str) -> str:
    """``value`` as a label value of the text format writes it between its quotes."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _insert_label(line: str, label: str, pair: str, worker: str) -> tuple[str, str]:
    """The metric name of the sample ``line`` and the line with ``pair`` (``label="value"``) as its first label."""
    name = _METRIC_NAME.match(line)
    at = name.end() if name is not None else 0
    if name is None or at == len(line) or line[at] not in " \t{":
        raise ValueError(f"worker {worker!r}: not a sample line: {line!r}")
    if line[at] != "{":
        return name[0], f"{line[:at]}{{{pair}}}{line[at:]}"
    labels = _label_names(line, at + 1)
    if labels is None:
        raise ValueError(f"worker {worker!r}: unreadable label set: {line!r}")
    if label in labels:
        raise ValueError(f"worker {worker!r}: sample already has the label {label!r}: {line!r}")
    comma = "," if labels else ""
    return name[0], f"{line[: at + 1]}{pair}{comma}{line[at + 1 :]}"


def _label_names(line: str, at: int) -> list[str] | None:
    """The names of the label set that opens just before ``at`` in ``line``; None if it is not one."""
    names: list[str] = []
    while _LABEL_SET_END.match(line, at) is None:
        pair = _LABEL_PAIR.match(line, at)
        if pair is None:
            return None
        names.append(pair[1])
        if pair[2] == "}":
            break
        at = pair.end()
    return names
