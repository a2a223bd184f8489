"""Word error rate and speed over a data set, for each engine configuration asked for (the ``eval`` command is
:mod:`streamer.cli.evaluate`).

A data set is a TSV of ``path<TAB>reference`` lines (paths relative to the TSV's folder, an optional ``file``
header line, an empty reference for non-speech). Each file is transcribed with
:func:`~streamer.offline.transcribe.transcribe`; both sides are normalised (Whisper's English normaliser by default) and
the WER is pooled over the set. The real-time factor is the engine's wall time over the audio's duration (file decoding
and model loading excluded).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamer.core.errors import ConfigError
from streamer.offline.normalize import WerResult, normalize_basic, normalize_english, word_error_rate

if TYPE_CHECKING:
    from streamer.engine.types import Engine
    from streamer.offline.audiofile import LoadedAudio
    from streamer.offline.transcribe import TranscribeOptions

__all__ = [
    "ConfigScore",
    "DatasetItem",
    "FileScore",
    "evaluate",
    "format_table",
    "read_dataset",
    "scores_json",
]

logger = logging.getLogger(__name__)

NORMALIZERS: dict[str, Callable[[str], str]] = {"english": normalize_english, "basic": normalize_basic}
DEFAULT_CONFIG = "default"  # the engine's own choice for this machine (EngineOptions())


@dataclass(frozen=True)
class DatasetItem:
    path: Path
    reference: str


@dataclass(frozen=True)
class FileScore:
    file: str
    reference: str  # normalised
    hypothesis: str  # normalised
    duration: float  # seconds of audio
    seconds: float  # engine wall time
    wer: WerResult


@dataclass(frozen=True)
class ConfigScore:
    """One row of the table: a configuration's pooled figures, or why it was skipped."""

    config: str
    files: tuple[FileScore, ...] = ()
    skipped: str | None = None  # the reason, when the configuration could not run here

    @property
    def audio_seconds(self) -> float:
        return sum(f.duration for f in self.files)

    @property
    def busy_seconds(self) -> float:
        return sum(f.seconds for f in self.files)

    @property
    def wer(self) -> WerResult:
        return word_error_rate([f.reference for f in self.files], [f.hypothesis for f in self.files])

    @property
    def rtf(self) -> float:
        return self.busy_seconds / self.audio_seconds if self.audio_seconds else 0.0


def read_dataset(tsv: Path, *, limit: int | None = None) -> list[DatasetItem]:
    """The items of a ``path<TAB>reference`` TSV, at most ``limit`` of them; a ``file`` header line is skipped."""
    try:
        lines = tsv.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"dataset {tsv}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"dataset {tsv} cannot be read: {error}") from None
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or (number == 1 and line.split("\t")[0] in ("file", "path")):
            continue
        path, tab, reference = line.partition("\t")
        if not tab:
            raise ConfigError(f"{tsv}:{number}: expected 'path<TAB>reference'")
        items.append(DatasetItem(tsv.parent / path, reference.strip()))
        if limit is not None and len(items) >= limit:
            break
    return items


def evaluate(
    engine: Engine,
    items: Sequence[tuple[DatasetItem, LoadedAudio]],
    *,
    config: str,
    options: TranscribeOptions | None = None,
    normalizer: Callable[[str], str] = normalize_english,
) -> ConfigScore:
    """Transcribe every item with ``engine`` and score it; blocks for the whole set."""
    from streamer.offline.transcribe import transcribe

    scores = []
    for item, audio in items:
        started = time.perf_counter()
        transcript = transcribe(engine, audio.samples, options)
        seconds = time.perf_counter() - started
        reference, hypothesis = normalizer(item.reference), normalizer(transcript.text)
        score = FileScore(str(item.path), reference, hypothesis, audio.duration, seconds,
                          word_error_rate([reference], [hypothesis]))  # fmt: skip
        logger.info("%s %s: WER %.1f%% RTF %.3f", config, item.path.name, 100 * score.wer.wer, seconds / audio.duration)
        scores.append(score)
    return ConfigScore(config, tuple(scores))


def format_table(scores: Sequence[ConfigScore]) -> str:
    """The figures as one aligned table, one row per configuration; skipped ones say why."""
    header = ("config", "files", "audio s", "WER %", "RTF")
    rows = []
    for score in scores:
        if score.skipped is not None:
            rows.append((score.config, "-", "-", "-", "-", f"skipped: {score.skipped}"))
            continue
        figures = (
            str(len(score.files)),
            f"{score.audio_seconds:.1f}",
            f"{100 * score.wer.wer:.2f}",
            f"{score.rtf:.3f}",
        )
        rows.append((score.config, *figures, ""))
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]
    lines = []
    for cells in [(*header, ""), *rows]:
        left = cells[0].ljust(widths[0])
        right = "  ".join(cell.rjust(width) for cell, width in zip(cells[1:5], widths[1:], strict=True))
        lines.append(f"{left}  {right}  {cells[5]}".rstrip())
    return "\n".join(lines) + "\n"


def scores_json(dataset: Path, model: str, scores: Sequence[ConfigScore]) -> dict[str, Any]:
    """The figures of ``scores`` (per file too) as the JSON object ``eval --json`` writes."""
    return {
        "dataset": str(dataset),
        "model": model,
        "configs": [
            {
                "config": s.config,
                "skipped": s.skipped,
                "files": len(s.files),
                "audio_seconds": round(s.audio_seconds, 3),
                "engine_seconds": round(s.busy_seconds, 3),
                "rtf": round(s.rtf, 4),
                **asdict(s.wer),
                "per_file": [asdict(f) for f in s.files],
            }
            for s in scores
        ],
    }
