"""``streamer bench keywords``: what a session's keywords buy (issue 17), and what a prompt costs on silence.

LibriSpeech utterances whose references hold names and rare words (:data:`UTTERANCES`, chosen by hand from the
test sets: names the model spells wrong and names it gets right, archaic and rare words) are each decoded as one
window, the way the streaming core decodes an utterance, under every condition in one run:

- ``none``: no keywords (what the model hears alone);
- ``glossary``: the keywords in the prompt only (``Glossary: a, b, c.``, ``keyword_bonus`` 0);
- ``glossary + bonus B``: the same, and each keyword's next token boosted by B logits in the greedy step.

Each utterance's keywords are its own rare words plus :data:`DISTRACTORS` rare words of other utterances, as a
session's list holds words that are not said. Reported: recall of the rare words (the normalised reference's
occurrences found in the hypothesis), pooled WER, and distractors emitted (a keyword written where it was not said).
Then every file of the non-speech set (``nonspeech/``: noise, music, silence) is decoded in 30 s windows with no
prompt and with a prompt and every keyword of the set: the words emitted there must not grow (a prompt must not make
the model hallucinate on silence). The windows go straight to the engine, without the VAD that keeps most
non-speech from it in streaming: the harsher case.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from streamer.bench.report import Report, add_docs_argument, command_line, format_table, machine_note, write_report

__all__ = [
    "DISTRACTORS",
    "NONSPEECH_PROMPT",
    "UTTERANCES",
    "Condition",
    "KeywordScore",
    "conditions",
    "configure_parser",
    "count_phrase",
    "keyword_lists",
    "run",
    "score",
]

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO.parent / "shared" / "data"

# (file under librispeech/, its names and rare words as a user would list them). Chosen from tiny.en's offline
# transcripts of the 66 LibriSpeech utterances in ../shared/data: names and rare words it misspells (Helstone,
# Zarathustra, Liddy, tabu...) and some it gets right (Margaret, Sherburn, Douglas), so that keywords are seen to
# help the first without harming the second.
UTTERANCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("test-other/1688/142285/1688-142285-0001.flac", ("Margaret", "Hale", "Thornton")),
    ("test-other/1688/142285/1688-142285-0005.flac", ("shoppy", "Helstone")),
    ("test-other/2414/128291/2414-128291-0001.flac", ("quickeneth",)),
    ("test-other/2414/128291/2414-128291-0002.flac", ("Zarathustra", "spake", "kine")),
    ("test-other/2414/128291/2414-128291-0004.flac", ("seekest", "mischief")),
    ("test-other/2414/128291/2414-128291-0009.flac", ("behold", "kine")),
    ("test-other/3005/163389/3005-163389-0000.flac", ("Sherburn", "palings")),
    ("test-other/3005/163389/3005-163389-0006.flac", ("acquit", "lynches")),
    ("test-other/3331/159605/3331-159605-0000.flac", ("Puttel", "fender")),
    ("test-other/3331/159605/3331-159605-0008.flac", ("Polly", "assailed")),
    ("test-other/3331/159605/3331-159605-0009.flac", ("Polly", "doubtless")),
    ("test-other/533/1066/533-1066-0000.flac", ("churchyards", "yawn")),
    ("test-other/533/1066/533-1066-0002.flac", ("Liddy", "Jamieson")),
    ("test-other/533/1066/533-1066-0003.flac", ("Warner", "bachelor")),
    ("test-other/533/1066/533-1066-0004.flac", ("Liddy", "deference", "concocted")),
    ("test-other/533/1066/533-1066-0005.flac", ("Innes",)),
    ("test-clean/3570/5694/3570-5694-0005.flac", ("tabu", "victuals")),
    ("test-clean/8555/284447/8555-284447-0000.flac", ("sailorman", "dominions")),
    ("test-clean/121/127105/121-127105-0000.flac", ("Douglas",)),
    ("test-clean/8463/287645/8463-287645-0007.flac", ("Wesley",)),
)

# rare words of other utterances added to each utterance's keywords (said elsewhere, not in it)
DISTRACTORS = 3

# the prompt the non-speech set is decoded with, beside every keyword of UTTERANCES
NONSPEECH_PROMPT = "A reading from a nineteenth-century novel."


@dataclass(frozen=True)
class Condition:
    """One way of decoding: with the utterance's keywords or not, and the bonus of their tokens."""

    name: str
    keywords: bool
    bonus: float


def conditions(bonuses: Sequence[float]) -> list[Condition]:
    """``none``, ``glossary`` (prompt only) and one ``glossary + bonus B`` per positive B."""
    found = [Condition("none", False, 0.0), Condition("glossary", True, 0.0)]
    return found + [Condition(f"glossary + bonus {b:g}", True, b) for b in bonuses if b > 0]


def keyword_lists(
    utterances: Sequence[tuple[str, tuple[str, ...]]], distractors: int = DISTRACTORS
) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """For each utterance, (its own rare words, ``distractors`` rare words of the next utterances that it does not
    hold), in a fixed order, so every run lists the same words."""
    lists = []
    for index, (_, own) in enumerate(utterances):
        taken = {w.lower() for w in own}  # words compare as the normaliser compares them: without case
        others: list[str] = []
        for step in range(1, len(utterances)):
            for word in utterances[(index + step) % len(utterances)][1]:
                if len(others) < distractors and word.lower() not in taken:
                    others.append(word)
                    taken.add(word.lower())
        lists.append((own, tuple(others)))
    return lists


def count_phrase(words: Sequence[str], phrase: Sequence[str]) -> int:
    """Non-overlapping occurrences of ``phrase`` (a word sequence) in ``words``."""
    if not phrase:
        return 0
    count = index = 0
    while index + len(phrase) <= len(words):
        if list(words[index : index + len(phrase)]) == list(phrase):
            count += 1
            index += len(phrase)
        else:
            index += 1
    return count


@dataclass(frozen=True)
class KeywordScore:
    """One utterance under one condition, words counted on normalised text."""

    found: int  # occurrences of its rare words in the reference that the hypothesis holds (at most as many)
    said: int  # occurrences of its rare words in the reference
    false_alarms: int  # occurrences of its distractors in the hypothesis beyond those in the reference


def score(
    reference: str,
    hypothesis: str,
    keywords: Sequence[str],
    distractors: Sequence[str],
    normalize: Callable[[str], str],
) -> KeywordScore:
    """Recall of ``keywords`` in ``hypothesis`` against ``reference``, and ``distractors`` it wrote unsaid, after
    ``normalize`` (the English normaliser) on every side."""
    ref = normalize(reference).split()
    hyp = normalize(hypothesis).split()
    found = said = alarms = 0
    for keyword in dict.fromkeys(keywords):
        phrase = normalize(keyword).split()
        expected = count_phrase(ref, phrase)
        said += expected
        found += min(expected, count_phrase(hyp, phrase))
    for word in dict.fromkeys(distractors):
        phrase = normalize(word).split()
        alarms += max(0, count_phrase(hyp, phrase) - count_phrase(ref, phrase))
    return KeywordScore(found, said, alarms)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny.en", help="model (default: %(default)s)")
    parser.add_argument(
        "--bonus",
        type=float,
        action="append",
        help="keyword bonuses to measure beside the glossary alone (repeatable; default: 1.5, 3, 6)",
    )
    parser.add_argument("--data", type=Path, help="the shared data folder (default: ../shared/data beside the repo)")
    add_docs_argument(parser)


def _relative(path: Path) -> str:
    """``path`` relative to the repository (committed docs name no machine's folders)."""
    import os

    return os.path.relpath(os.path.abspath(path), REPO)  # not resolved: ../shared/data may be a link


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from streamer.bench.nonspeech import shared_nonspeech
    from streamer.core.options import CoreOptions
    from streamer.core.units import N_SAMPLES, SAMPLE_RATE
    from streamer.engine import DecodeOptions, DecodeRequest, load_engine
    from streamer.engine.types import KEYWORD_BONUS
    from streamer.offline.audiofile import load_audio
    from streamer.offline.normalize import normalize_english, word_error_rate

    machine = machine_note()
    data: Path = args.data or SHARED_DATA
    started = time.perf_counter()
    bonuses = args.bonus or [1.5, 3.0, 6.0]
    chosen = conditions(bonuses)
    folder = data / "librispeech"
    references = {
        line.split("\t")[0]: line.split("\t")[1]
        for line in (folder / "transcripts.tsv").read_text(encoding="utf-8").splitlines()[1:]
    }
    lists = keyword_lists(UTTERANCES)
    audio = [load_audio(folder / name).samples for name, _ in UTTERANCES]
    # the streaming core's decoding (one temperature, loop guards), without word timings: they change no token
    base = replace(CoreOptions().decode, word_timestamps=False)
    engine = load_engine(args.model)

    def decode(samples: np.ndarray, options: DecodeOptions) -> str:
        windows = [samples[i : i + N_SAMPLES] for i in range(0, max(1, len(samples)), N_SAMPLES)]
        results = engine.decode([DecodeRequest(audio=w, options=options) for w in windows])
        return " ".join(r.text.strip() for r in results if r.text.strip())

    scores: dict[str, list[KeywordScore]] = {c.name: [] for c in chosen}
    hypotheses: dict[str, list[str]] = {c.name: [] for c in chosen}
    try:
        for index, ((name, _), samples, (own, others)) in enumerate(zip(UTTERANCES, audio, lists, strict=True)):
            for condition in chosen:
                keywords = (*own, *others) if condition.keywords else ()
                text = decode(samples, replace(base, keywords=keywords, keyword_bonus=condition.bonus))
                hypotheses[condition.name].append(text)
                scores[condition.name].append(score(references[name], text, own, others, normalize_english))
            counts = " ".join(f"{scores[c.name][-1].found}" for c in chosen)
            print(f"{index + 1}/{len(UTTERANCES)} {name}: found {counts} of {scores['none'][-1].said}", file=sys.stderr)
        # the non-speech set, with no prompt and with the prompt and every keyword, at each bonus
        everything = tuple(dict.fromkeys(w for _, own in UTTERANCES for w in own))
        nonspeech = shared_nonspeech(data)  # the guitar from where its music starts, after its spoken count-in
        silent = [piece.samples for piece in nonspeech]
        silent_seconds = sum(len(s) for s in silent) / SAMPLE_RATE
        prompted = [("none", base)] + [
            (
                f"prompt + keywords, bonus {b:g}",
                replace(base, initial_prompt=NONSPEECH_PROMPT, keywords=everything, keyword_bonus=b),
            )
            for b in [0.0, *(b for b in bonuses if b > 0)]
        ]
        emitted = {label: [len(decode(s, options).split()) for s in silent] for label, options in prompted}
    finally:
        engine.close()

    refs = [normalize_english(references[name]) for name, _ in UTTERANCES]
    rows = []
    figures_conditions = {}
    for condition in chosen:
        found = sum(s.found for s in scores[condition.name])
        said = sum(s.said for s in scores[condition.name])
        alarms = sum(s.false_alarms for s in scores[condition.name])
        wer = word_error_rate(refs, [normalize_english(h) for h in hypotheses[condition.name]])
        rows.append(
            [condition.name, f"{found}/{said} ({100 * found / said:.0f} %)", f"{100 * wer.wer:.2f}", str(alarms)]
        )
        figures_conditions[condition.name] = {
            "bonus": condition.bonus,
            "keywords": condition.keywords,
            "found": found,
            "said": said,
            "recall": found / said,
            "wer": wer.wer,
            "distractors_emitted": alarms,
            "hypotheses": hypotheses[condition.name],
        }
    seconds = sum(len(a) for a in audio) / SAMPLE_RATE
    silent_rows = [[label, str(sum(counts)), " ".join(str(c) for c in counts)] for label, counts in emitted.items()]
    body = "\n".join(
        [
            f"{len(UTTERANCES)} LibriSpeech utterances ({seconds:.0f} s) whose references hold names and rare words "
            f"({sum(len(own) for own, _ in lists)} listed), each decoded as one window with the streaming core's "
            f"options by {args.model}; each utterance's keywords are its own rare words and {DISTRACTORS} of other "
            "utterances (distractors). Recall counts the rare words' occurrences in the normalised reference found "
            "in the hypothesis; distractors emitted counts keywords written where they were not said. The rare words "
            "were picked where tiny.en misspells them offline (and a few it spells right), so recall without keywords "
            f"is low by choice: the figures are the gap, and that nothing right is lost. Default bonus: "
            f"{KEYWORD_BONUS:g}.",
            "",
            format_table(["keywords", "rare-word recall", "WER %", "distractors emitted"], rows),
            "",
            f"Words emitted on the non-speech set ({len(silent)} files, {silent_seconds:.0f} s of noise, music and "
            f"silence, decoded in 30 s windows straight to the engine, without the VAD), with no prompt and with the "
            f'prompt "{NONSPEECH_PROMPT}" and all {len(everything)} keywords:',
            "",
            format_table(["prompt", "words emitted", "per file"], silent_rows),
            "",
            f"Files: {', '.join(piece.name.removeprefix('nonspeech/') for piece in nonspeech)}. Total run time "
            f"{time.perf_counter() - started:.0f} s.",
        ]
    )
    print(f"keywords benchmark:\n{body}")
    figures = {
        "machine": machine,
        "model": args.model,
        "data": _relative(data),
        "utterances": [
            {"file": name, "keywords": list(own), "distractors": list(others)}
            for (name, _), (own, others) in zip(UTTERANCES, lists, strict=True)
        ],
        "conditions": figures_conditions,
        "nonspeech": {
            "files": [piece.name.removeprefix("nonspeech/") for piece in nonspeech],
            "prompt": NONSPEECH_PROMPT,
            "words_emitted": emitted,
        },
    }
    report = Report("keywords", command_line("keywords", args), body, figures)
    print(f"wrote {write_report(report, args.docs)}", file=sys.stderr)
    return 0
