"""The streaming evaluation set of issue 16: every English recording of the shared data a stream can be judged on.

Four groups, each one stream per mono file (a stereo file is two streams, one per channel, as a two-channel
``/v1/listen`` session would transcribe it):

- ``longform``: every English recording of ``longform/`` (its language column in ``metadata.tsv``), with the
  utterance boundaries of ``NAME.segments.tsv`` where the file is a join;
- ``librispeech``: for each test-other speaker of ``librispeech/utterances.tsv``, their consecutive utterances joined
  end to end into one run of about a minute (the boundaries kept as utterances, for per-utterance scoring), unless a
  long-form file already is that join (1688's ten utterances are ``longform/librispeech_test-other_...``);
- ``telephony``: every English 8 kHz recording of ``telephony/`` (brought to 16 kHz by the server's resampler);
- ``conversation``: ``conversation/``; a stereo file's channels get their own references, from the TextGrid beside it
  (tier ``i`` is channel ``i``) or from its metadata note (``LEFT: ... | RIGHT: ...``).

Every stream names who speaks in it (:attr:`EvalStream.speaker`: a LibriSpeech reader by their id wherever their
voice appears, a corpus's single talker, a telephone talker, or a recording for a mix or an unnamed reader), and
:func:`assign_halves` splits the speakers into a **tuning half** and a **report half**: defaults are chosen on the
first and reported on the second (issue 39), and no speaker is in both.

Reading the tables is separate from loading audio, so the set's shape is tested without audio
(:func:`plan_speaker_runs`, :func:`read_textgrid`, :func:`channel_references`, :func:`assign_halves`).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from streamer.bench.harness import DATA, AudioArray, SpokenUtterance
from streamer.core.errors import ConfigError
from streamer.core.units import SAMPLE_RATE

__all__ = [
    "GROUPS",
    "HALVES",
    "EvalStream",
    "SpeakerRun",
    "TextGridInterval",
    "assign_halves",
    "build_set",
    "channel_references",
    "plan_speaker_runs",
    "read_table",
    "read_textgrid",
    "speaker_of_utterance",
    "with_halves",
]

GROUPS = ("longform", "librispeech", "telephony", "conversation")
# defaults are chosen on the first and reported on the second
HALVES = ("tune", "report")
_CHANNEL_NAMES = ("left", "right")


@dataclass(frozen=True)
class EvalStream:
    """One stream of the set: mono 16 kHz audio, what is said in it, and where each source utterance lies."""

    # unique in the set: the file relative to the data folder, a channel suffix, or the speaker run's name
    name: str
    group: str
    samples: AudioArray
    reference: str
    utterances: tuple[SpokenUtterance, ...] = ()
    # who speaks: one speaker's identity across the set ("librispeech:1688"), or the recording's for a mix
    speaker: str = ""
    # which half of the set it is in (HALVES), by its speaker; set by build_set
    half: str = ""

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def speaker_of_utterance(utt_id: str) -> str | None:
    """The speaker of a source utterance id: LibriSpeech's ``SPEAKER-CHAPTER-NNNN`` or LJSpeech's ``LJnnn-nnnn``
    (one talker); None for another id."""
    if re.fullmatch(r"\d+-\d+-\d+", utt_id):
        return f"librispeech:{utt_id.split('-')[0]}"
    if re.fullmatch(r"LJ\d+-\d+", utt_id):
        return "ljspeech"
    return None


def _telephony_speaker(file: str) -> str:
    """The Open Speech Repository numbers its talkers' Harvard lists in tens (``OSR_us_000_0010`` and ``_0011`` are
    one talker); NOIZEUS names its talker-sentence ``spNN``; any other file is its own speaker."""
    osr = re.match(r"(OSR_\w+?_\d{3})_(\d{3})\d_", file)
    if osr:
        return f"osr:{osr.group(1)}_{osr.group(2)}x"
    noizeus = re.match(r"noizeus_(sp\d+)_", file)
    return f"noizeus:{noizeus.group(1)}" if noizeus else f"telephony/{file}"


def assign_halves(seconds: dict[str, tuple[str, float]]) -> dict[str, str]:
    """Each speaker's half (:data:`HALVES`), from ``speaker -> (the group most of their audio is in, seconds)``.

    Speakers go, longest first (ties by name), to the half that holds less of their group's audio so far (then less
    audio overall; then the tuning half): each group is split as evenly as whole speakers allow, and the split of
    a speaker does not depend on which groups or streams a run selects, only on the whole set."""
    halves: dict[str, str] = {}
    per_group: dict[tuple[str, str], float] = {}
    total = dict.fromkeys(HALVES, 0.0)
    for speaker, (group, length) in sorted(seconds.items(), key=lambda kv: (-kv[1][1], kv[0])):
        half = min(HALVES, key=lambda h: (per_group.get((group, h), 0.0), total[h], HALVES.index(h)))
        halves[speaker] = half
        per_group[(group, half)] = per_group.get((group, half), 0.0) + length
        total[half] += length
    return halves


def read_table(path: Path) -> list[dict[str, str]]:
    """A tab-separated table with a header row (the shared data's ``*.tsv``); quotes are text, not quoting."""
    with path.open(encoding="utf-8", newline="") as f:
        return [dict(row) for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]


@dataclass(frozen=True)
class SpeakerRun:
    """A speaker's consecutive utterances, to be joined into one stream."""

    speaker: str
    subset: str
    files: tuple[str, ...]  # relative to the LibriSpeech folder, in order
    texts: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"librispeech/{self.subset}-{self.speaker}-joined"

    @property
    def identity(self) -> str:
        return f"librispeech:{self.speaker}"


def plan_speaker_runs(rows: Iterable[dict[str, str]], subset: str, covered: frozenset[str]) -> list[SpeakerRun]:
    """Group ``utterances.tsv`` rows of ``subset`` by speaker, utterances in id order; a speaker whose utterances are
    all in ``covered`` (the source utterances of the long-form joins) is left out: that run is already in the set."""
    by_speaker: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        if row["subset"] == subset:
            by_speaker.setdefault(row["speaker"], []).append(row)
    runs = []
    for speaker in sorted(by_speaker, key=int):
        utterances = sorted(by_speaker[speaker], key=lambda r: r["utt_id"])
        if all(r["utt_id"] in covered for r in utterances):
            continue
        files = tuple(r["file"] for r in utterances)
        runs.append(SpeakerRun(speaker, subset, files, tuple(r["transcript"] for r in utterances)))
    return runs


@dataclass(frozen=True)
class TextGridInterval:
    start: float  # seconds
    end: float
    text: str


_TIER = re.compile(r'class = "IntervalTier"\s*name = "([^"]*)"(.*?)(?=class = "|\Z)', re.DOTALL)
_INTERVAL = re.compile(r'xmin = ([\d.]+)\s*xmax = ([\d.]+)\s*text = "(.*?)"', re.DOTALL)


def read_textgrid(text: str) -> dict[str, list[TextGridInterval]]:
    """The interval tiers of a Praat TextGrid (long text format): tier name to its non-empty intervals, in order."""
    tiers: dict[str, list[TextGridInterval]] = {}
    for name, body in _TIER.findall(text):
        tiers[name] = [
            TextGridInterval(float(a), float(b), " ".join(t.split()))
            for a, b, t in _INTERVAL.findall(body)
            if t.strip()
        ]
    return tiers


def channel_references(
    channels: int, note: str, textgrid: str | None
) -> list[tuple[str, tuple[SpokenUtterance, ...]]] | None:
    """Each channel's reference (and utterances, from a TextGrid) of a multi-channel file, or None when neither the
    TextGrid nor the metadata note says who speaks on which channel."""
    if textgrid is not None:
        tiers = list(read_textgrid(textgrid).values())
        if len(tiers) == channels:
            result = []
            for intervals in tiers:
                utterances = tuple(
                    SpokenUtterance(round(i.start * SAMPLE_RATE), round(i.end * SAMPLE_RATE), i.text) for i in intervals
                )
                result.append((" ".join(i.text for i in intervals), utterances))
            return result
    match = re.search(r"LEFT:\s*(.*?)\s*\|\s*RIGHT:\s*(.*?)\s*$", note)
    if channels == 2 and match:
        return [(match.group(1), ()), (match.group(2), ())]
    return None


def _english(folder: Path) -> list[dict[str, str]]:
    return [row for row in read_table(folder / "metadata.tsv") if row.get("language", "en") == "en"]


def _covered(data: Path) -> frozenset[str]:
    """The LibriSpeech utterances the long-form joins are made of."""
    folder = data / "longform"
    covered: set[str] = set()
    for row in _english(folder):
        segments = folder / (row["file"].split(".")[0] + ".segments.tsv")
        if segments.exists():
            covered |= {r["source_utt"] for r in read_table(segments)}
    return frozenset(covered)


def _longform(data: Path) -> list[EvalStream]:
    from streamer.bench.harness import load_bench_file

    streams = []
    folder = data / "longform"
    for row in _english(folder):
        file = load_bench_file(folder / row["file"])
        name = f"longform/{row['file']}"
        segments = folder / (row["file"].split(".")[0] + ".segments.tsv")
        speakers = (
            {speaker_of_utterance(r["source_utt"]) for r in read_table(segments)} if segments.exists() else {None}
        )
        speaker = speakers.pop() if len(speakers) == 1 else None
        streams.append(
            EvalStream(name, "longform", file.samples, file.reference or "", file.utterances, speaker=speaker or name)
        )
    return streams


def _speaker_streams(data: Path, covered: frozenset[str]) -> list[EvalStream]:
    from streamer.offline.audiofile import load_audio

    folder = data / "librispeech"
    streams = []
    rows = read_table(folder / "utterances.tsv")
    for run in [*plan_speaker_runs(rows, "test-other", covered), *plan_speaker_runs(rows, "test-clean", covered)]:
        pieces = [load_audio(folder / f).samples for f in run.files]
        bounds = np.cumsum([0] + [len(p) for p in pieces])
        utterances = tuple(
            SpokenUtterance(int(a), int(b), t) for a, b, t in zip(bounds[:-1], bounds[1:], run.texts, strict=True)
        )
        samples = np.concatenate(pieces).astype(np.float32)
        streams.append(
            EvalStream(run.name, "librispeech", samples, " ".join(run.texts), utterances, speaker=run.identity)
        )
    return streams


def _telephony(data: Path) -> list[EvalStream]:
    from streamer.bench.harness import load_bench_file

    folder = data / "telephony"
    streams = []
    for row in _english(folder):
        file = load_bench_file(folder / row["file"])
        streams.append(
            EvalStream(
                f"telephony/{row['file']}",
                "telephony",
                file.samples,
                file.reference or "",
                speaker=_telephony_speaker(row["file"]),
            )
        )
    return streams


def _conversation(data: Path) -> list[EvalStream]:
    from streamer.offline.audiofile import load_audio

    folder = data / "conversation"
    references = {r["file"]: r["transcript"] for r in read_table(folder / "transcripts.tsv")}
    streams = []
    for row in _english(folder):
        name = f"conversation/{row['file']}"
        audio = load_audio(folder / row["file"], keep_channels=True)
        grid = folder / (row["file"].rsplit(".", 1)[0] + ".TextGrid")
        per_channel = (
            channel_references(
                audio.channels, row.get("note", ""), grid.read_text(encoding="utf-8") if grid.exists() else None
            )
            if audio.channels > 1
            else None
        )
        if per_channel is None:
            streams.append(EvalStream(name, "conversation", audio.samples, references[row["file"]], speaker=name))
            continue
        # a channel whose talker is a LibriSpeech reader (the transcript's source names the utterance) is that
        # reader; otherwise the recording is the unit (michaelandsickmichael's two channels are one person)
        sources = re.findall(r"(left|right) channel = (\d+-\d+-\d+)", row.get("transcript_source", ""))
        channel_speakers = {side: speaker_of_utterance(utt) for side, utt in sources}
        for index, ((reference, utterances), samples) in enumerate(
            zip(per_channel, audio.channel_samples, strict=True)
        ):
            label = _CHANNEL_NAMES[index] if audio.channels == 2 else f"channel {index}"
            speaker = channel_speakers.get(label) or name
            streams.append(
                EvalStream(f"{name} [{label}]", "conversation", samples, reference, utterances, speaker=speaker)
            )
    return streams


def with_halves(streams: Sequence[EvalStream]) -> list[EvalStream]:
    """``streams`` with their :attr:`~EvalStream.half`, by :func:`assign_halves` over their speakers (each speaker's
    group: where most of their audio is)."""
    by_speaker: dict[str, dict[str, float]] = {}
    for s in streams:
        groups = by_speaker.setdefault(s.speaker or s.name, {})
        groups[s.group] = groups.get(s.group, 0.0) + s.seconds
    seconds = {
        speaker: (max(groups, key=lambda g: (groups[g], g)), sum(groups.values()))
        for speaker, groups in by_speaker.items()
    }
    halves = assign_halves(seconds)
    return [replace(s, half=halves[s.speaker or s.name]) for s in streams]


def build_set(
    groups: Sequence[str] = GROUPS, data: Path = DATA, only: Sequence[str] = (), half: str | None = None
) -> list[EvalStream]:
    """Load the streams of ``groups`` (every group by default) from ``data``, each with its half of the whole set
    (:func:`with_halves`); ``only`` keeps the streams whose name contains one of its strings, ``half`` those of one
    half. Raises :class:`~streamer.core.errors.ConfigError` for an unknown group or half, or a set that comes out
    empty."""
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise ConfigError(f"unknown group(s) {', '.join(unknown)}: use {', '.join(GROUPS)}")
    if half is not None and half not in HALVES:
        raise ConfigError(f"unknown half {half!r}: use {', '.join(HALVES)}")
    if not data.is_dir():
        raise ConfigError(f"{data}: no shared data folder")
    # the halves are the whole set's, whatever this run selects
    streams = with_halves(
        [*_longform(data), *_speaker_streams(data, _covered(data)), *_telephony(data), *_conversation(data)]
    )
    streams = [s for s in streams if s.group in groups and (half is None or s.half == half)]
    if only:
        streams = [s for s in streams if any(o in s.name for o in only)]
    if not streams:
        raise ConfigError("the evaluation set is empty: check --group and --only")
    return streams
