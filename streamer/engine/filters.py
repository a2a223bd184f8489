"""Logit filters applied before every token choice (openai/whisper ``decoding.py``: ``SuppressBlank``,
``SuppressTokens``, ``ApplyTimestampRules``), row by row, so rows at different steps can share one batch; and the
keyword bonus (issue 17), last, which favours the spellings a session asked for."""

from __future__ import annotations

from collections import OrderedDict

import torch

from streamer.core.units import TIME_PRECISION
from streamer.engine.keywords import KeywordTrie
from streamer.engine.tokenizer import WhisperTokenizer
from streamer.engine.types import DecodeOptions

__all__ = ["NEG_INF", "LogitFilters"]

NEG_INF = float("-inf")
# keyword lists whose tokenisation is kept: one per live session's list is plenty, and a list is cheap to redo
_TRIES_KEPT = 64


class LogitFilters:
    """Built once per model; :meth:`apply` edits ``[rows, vocab]`` logits in place."""

    def __init__(
        self, tokenizer: WhisperTokenizer, suppress: tuple[int, ...], suppress_begin: tuple[int, ...], vocab: int
    ) -> None:
        self.tok = tokenizer
        sp = tokenizer.special
        base = set(suppress) if suppress else set(tokenizer.non_speech_tokens)
        base |= {sp.transcribe, sp.translate, sp.sot, sp.sot_prev, sp.no_speech}
        if sp.sot_lm is not None:
            base.add(sp.sot_lm)
        self.suppress = torch.tensor(sorted(t for t in base if t < vocab), dtype=torch.long)
        begin = set(suppress_begin) or {*tokenizer.encode(" "), sp.eot}
        self.suppress_begin = torch.tensor(sorted(begin), dtype=torch.long)
        self._tries: OrderedDict[tuple[str, ...], KeywordTrie] = OrderedDict()

    def apply(self, logits: torch.Tensor, sequences: list[list[int]], options: DecodeOptions) -> None:
        """Filter row ``r`` of ``logits`` given ``sequences[r]``, the tokens sampled so far for that row."""
        begin = [row for row, seq in enumerate(sequences) if not seq]
        if options.suppress_blank and begin:
            logits[torch.tensor(begin).view(-1, 1), self.suppress_begin.view(1, -1)] = NEG_INF
        logits[:, self.suppress] = NEG_INF
        if options.without_timestamps:
            logits[:, self.tok.special.timestamp_begin :] = NEG_INF
        else:
            self._timestamp_rules(logits, sequences, begin, round(options.max_initial_timestamp / TIME_PRECISION))
        if options.keywords and options.keyword_bonus > 0:
            self._boost_keywords(logits, sequences, options)

    def trie(self, keywords: tuple[str, ...]) -> KeywordTrie:
        """The tokenisation of ``keywords`` (kept for the next windows of the same session)."""
        trie = self._tries.get(keywords)
        if trie is None:
            trie = self._tries[keywords] = KeywordTrie.of(self.tok.encode, keywords)
            if len(self._tries) > _TRIES_KEPT:
                self._tries.popitem(last=False)
        self._tries.move_to_end(keywords)
        return trie

    def _boost_keywords(self, logits: torch.Tensor, sequences: list[list[int]], options: DecodeOptions) -> None:
        """Add ``options.keyword_bonus`` to each keyword's next token, after the rules: a token they ruled out stays
        out (-inf plus a bonus is -inf), so timestamps and suppression decide as without keywords."""
        trie = self.trie(options.keywords)
        rows: list[int] = []
        tokens: list[int] = []
        for row, seq in enumerate(sequences):
            boosted = trie.next_tokens(seq)
            rows.extend([row] * len(boosted))
            tokens.extend(boosted)
        if rows:
            logits[torch.tensor(rows), torch.tensor(tokens)] += options.keyword_bonus

    def _timestamp_rules(
        self, logits: torch.Tensor, sequences: list[list[int]], begin: list[int], max_initial: int
    ) -> None:
        sp = self.tok.special
        tb = sp.timestamp_begin
        logits[:, sp.no_timestamps] = NEG_INF
        for row, seq in enumerate(sequences):
            last_ts = len(seq) >= 1 and seq[-1] >= tb
            penultimate_ts = len(seq) < 2 or seq[-2] >= tb
            if last_ts:
                if penultimate_ts:  # a pair just closed: text must follow
                    logits[row, tb:] = NEG_INF
                else:  # a timestamp opened: no text until it is closed
                    logits[row, : sp.eot] = NEG_INF
            last_stamp = next((t for t in reversed(seq) if t >= tb), None)
            if last_stamp is not None:
                # timestamps never decrease, and a segment has non-zero length
                floor = last_stamp if last_ts and not penultimate_ts else last_stamp + 1
                logits[row, tb:floor] = NEG_INF
        for row in begin:
            logits[row, :tb] = NEG_INF  # the first token is a timestamp
            logits[row, tb + max_initial + 1 :] = NEG_INF
        # whisper compares the timestamps' total log-probability with the best text token's; both are log-softmax
        # values of one row, so the row's log-normaliser cancels and the raw logits compare the same, without a
        # vocabulary-sized log-softmax per row
        timestamp_lse = logits[:, tb:].logsumexp(dim=-1)
        text_best = logits[:, :tb].amax(dim=-1)
        force = timestamp_lse > text_best
        if bool(force.any()):
            logits[force, :tb] = NEG_INF
