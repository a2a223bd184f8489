"""Speaker labels on the shared real conversation (issue 40): conversation/michaelandsickmichael.wav, one talker per
channel, mixed to mono, its turns from the TextGrid beside it; scored by streamer.bench.speakers' offline pipeline
and its live diarizer (word attribution, speaker count, DER with its parts).

Run: ``.venv/bin/python bench/real_conversation.py`` (needs ../shared/data and the Resemblyzer weights).
"""

from __future__ import annotations

import re

import numpy as np
import soundfile as sf
import torch

from streamer.bench.conversations import Conversation, Turn, spread_words
from streamer.bench.harness import DATA
from streamer.bench.speakers import diarize_live, embed_conversation, pool, pool_live, score
from streamer.core.speakers import SpeakerOptions
from streamer.engine.speaker_encoder import load_speaker_encoder

NAME = "michaelandsickmichael"


def conversation() -> Conversation:
    """The recording mixed to mono, a turn per non-empty TextGrid interval (the tier names are the speakers)."""
    folder = DATA / "conversation"
    audio, _ = sf.read(folder / f"{NAME}.wav", dtype="float32")
    mono = audio.mean(axis=1).astype(np.float32)
    turns = []
    for tier in re.split(r"item \[\d+\]:", (folder / f"{NAME}.TextGrid").read_text())[1:]:
        found = re.search(r'name = "([^"]+)"', tier)
        speaker = found.group(1) if found else "?"
        for xmin, xmax, text in re.findall(r'xmin = ([\d.]+)\s+xmax = ([\d.]+)\s+text = "([^"]*)"', tier, re.S):
            if text.strip():
                start, end = round(float(xmin) * 16000), round(float(xmax) * 16000)
                words = spread_words(" ".join(text.split()), start, end, speaker)
                turns.append(Turn(speaker, start, end, f"{speaker}-{start}", words))
    return Conversation(f"{NAME} (mono)", mono, tuple(sorted(turns, key=lambda t: t.start)), "report")


def main() -> None:
    torch.set_num_threads(1)
    recording, encoder, options = conversation(), load_speaker_encoder(), SpeakerOptions()
    offline = score(embed_conversation(recording, encoder, options), options)
    print(f"offline: {pool([offline]).line()}; found {offline.found} of {offline.speakers}; {offline.der}")
    print(f"live: {pool_live([diarize_live(recording, encoder, options, decode_ms=300)]).line()}")


if __name__ == "__main__":
    main()
