"""Logit filters applied before every token choice (openai/whisper ``decoding.py``: ``SuppressBlank``,
``SuppressTokens``, ``ApplyTimestampRules``), row by row, so rows at different steps can share one batch; and the
keyword bonus (issue 17), last, which favours the spellings a session asked for."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from streamer.core.units import TIME_PRECISION
from streamer.engine.keywords import KeywordTrie
from streamer.engine.memory import upload
from streamer.engine.tokenizer import WhisperTokenizer
from streamer.engine.types import DecodeOptions

__all__ = ["NEG_INF", "LogitFilters", "PositionRules"]

NEG_INF = float("-inf")
# keyword lists whose tokenisation is kept: one per live session's list is plenty, and a list is cheap to redo
_TRIES_KEPT = 64


@dataclass(frozen=True)
class PositionRules:
    """What the filters need of each position's sequence so far, one entry per position, for :meth:`LogitFilters.
    apply_rules`: built on the host from tokens it already has, uploaded before a pass, applied on the device
    without reading anything back (the static-shape decoder's path, :mod:`streamer.engine.static`)."""

    blank: torch.Tensor  # bool [N]: nothing sampled yet and options.suppress_blank (the blank and end-of-text out)
    plain: torch.Tensor  # bool [N]: options.without_timestamps (every timestamp out)
    begin: torch.Tensor  # bool [N]: nothing sampled yet, with timestamps (text and late timestamps out)
    closed: torch.Tensor  # bool [N]: the last two tokens are timestamps (or the only one is): timestamps out
    opened: torch.Tensor  # bool [N]: the last token is a timestamp and the one before is not: text out
    floor: torch.Tensor  # long [N]: timestamp tokens below this are out (timestamp_begin when there is none)
    ceiling: torch.Tensor  # long [N]: at the beginning, timestamp tokens from this on are out (else the vocabulary)
    bonus_at: torch.Tensor  # long [K]: positions whose keyword tokens get a bonus
    bonus_token: torch.Tensor  # long [K]: the token at each
    bonus: torch.Tensor  # float [K]: its bonus

    def to(self, device: torch.device) -> PositionRules:
        """The rules on ``device`` (:func:`~streamer.engine.memory.upload`: to a GPU without waiting)."""
        return PositionRules(**{name: upload(getattr(self, name), device) for name in self.__dataclass_fields__})

    def narrow(self, start: int, count: int) -> PositionRules:
        """Positions ``start .. start + count`` (keyword bonuses re-indexed to them)."""
        end = start + count
        keep = (self.bonus_at >= start) & (self.bonus_at < end)
        return PositionRules(
            blank=self.blank[start:end],
            plain=self.plain[start:end],
            begin=self.begin[start:end],
            closed=self.closed[start:end],
            opened=self.opened[start:end],
            floor=self.floor[start:end],
            ceiling=self.ceiling[start:end],
            bonus_at=self.bonus_at[keep] - start,
            bonus_token=self.bonus_token[keep],
            bonus=self.bonus[keep],
        )


class LogitFilters:
    """Built once per model; :meth:`apply` edits ``[rows, vocab]`` logits in place, row by row on the host's view of
    each sequence; :meth:`rules` and :meth:`apply_rules` do the same in whole-tensor operations (the device path)."""

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
        self._vocab = vocab
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # per device: suppressed, begin-blank

    def rules(self, positions: Sequence[tuple[list[int], list[int], DecodeOptions]]) -> PositionRules:
        """The rules for each position of each ``(sequence, fed, options)``: the positions after ``fed[0]``, ..,
        ``fed[-1]``, where the sequence at the position after ``fed[k]`` is ``sequence + fed[1 : k + 1]`` (a draft
        fed after the last choice, verified as if the tokens before it were accepted). Host work linear in the
        positions but for keyword rows (whose trie reads each whole sequence, as :meth:`apply` does)."""
        tb = self.tok.special.timestamp_begin
        blank: list[bool] = []
        plain: list[bool] = []
        begin: list[bool] = []
        closed: list[bool] = []
        opened: list[bool] = []
        floor: list[int] = []
        ceiling: list[int] = []
        bonus_at: list[int] = []
        bonus_token: list[int] = []
        bonus: list[float] = []
        for sequence, fed, options in positions:
            stamps = not options.without_timestamps
            max_initial = tb + round(options.max_initial_timestamp / TIME_PRECISION) + 1
            keywords = options.keyword_bonus > 0 and bool(options.keywords)
            trie = self.trie(options.keywords) if keywords else None
            length = len(sequence)
            last = sequence[-1] if length else -1
            before = sequence[-2] if length >= 2 else -1
            stamp = next((t for t in reversed(sequence) if t >= tb), None)
            for k in range(len(fed)):
                if k:  # the sequence at this position ends with fed[k]
                    length, before, last = length + 1, last, fed[k]
                    stamp = last if last >= tb else stamp
                last_ts = length >= 1 and last >= tb
                penultimate_ts = length < 2 or before >= tb
                blank.append(length == 0 and options.suppress_blank)
                plain.append(not stamps)
                begin.append(stamps and length == 0)
                closed.append(stamps and last_ts and penultimate_ts)
                opened.append(stamps and last_ts and not penultimate_ts)
                if not stamps or stamp is None:
                    floor.append(tb)
                else:
                    floor.append(stamp if last_ts and not penultimate_ts else stamp + 1)
                ceiling.append(max_initial if stamps and length == 0 else self._vocab)
                if trie is not None:
                    boosted = trie.next_tokens(sequence + fed[1 : k + 1])
                    bonus_at.extend([len(blank) - 1] * len(boosted))
                    bonus_token.extend(boosted)
                    bonus.extend([options.keyword_bonus] * len(boosted))
        return PositionRules(
            blank=torch.tensor(blank, dtype=torch.bool),
            plain=torch.tensor(plain, dtype=torch.bool),
            begin=torch.tensor(begin, dtype=torch.bool),
            closed=torch.tensor(closed, dtype=torch.bool),
            opened=torch.tensor(opened, dtype=torch.bool),
            floor=torch.tensor(floor, dtype=torch.long),
            ceiling=torch.tensor(ceiling, dtype=torch.long),
            bonus_at=torch.tensor(bonus_at, dtype=torch.long),
            bonus_token=torch.tensor(bonus_token, dtype=torch.long),
            bonus=torch.tensor(bonus, dtype=torch.float32),
        )

    def apply_rules(self, logits: torch.Tensor, rules: PositionRules) -> None:
        """:meth:`apply` for ``[N, vocab]`` logits of the positions ``rules`` describes (on the logits' device), in
        whole-tensor operations: no host synchronisation, no per-row loop. The same rules in the same order, so the
        same logits (tests/engine/test_filters.py holds the two to equal results)."""
        device = logits.device
        if device not in self._on:
            begin_tokens = torch.zeros(logits.shape[1], dtype=torch.bool)
            begin_tokens[self.suppress_begin] = True
            self._on[device] = (self.suppress.to(device), begin_tokens.to(device))
        suppressed, begin_tokens = self._on[device]
        sp = self.tok.special
        tb = sp.timestamp_begin
        vocab = torch.arange(logits.shape[1], device=device).view(1, -1)
        stamps = vocab >= tb
        logits.masked_fill_(rules.blank.view(-1, 1) & begin_tokens.view(1, -1), NEG_INF)
        logits[:, suppressed] = NEG_INF
        logits.masked_fill_(rules.plain.view(-1, 1) & stamps, NEG_INF)
        timed = ~rules.plain
        logits[:, sp.no_timestamps].masked_fill_(timed, NEG_INF)
        out = (rules.closed.view(-1, 1) & stamps) | (rules.opened.view(-1, 1) & (vocab < sp.eot))
        out |= stamps & (vocab < rules.floor.view(-1, 1))
        out |= rules.begin.view(-1, 1) & (~stamps | (vocab >= rules.ceiling.view(-1, 1)))
        logits.masked_fill_(out, NEG_INF)
        timestamp_lse = logits[:, tb:].logsumexp(dim=-1)
        text_best = logits[:, :tb].amax(dim=-1)
        force = timed & (timestamp_lse > text_best)
        logits.masked_fill_(force.view(-1, 1) & ~stamps, NEG_INF)
        if rules.bonus_at.numel():
            logits[rules.bonus_at, rules.bonus_token] += rules.bonus

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
