"""Decoding one window: the token loop with its logit filters, temperature fallback and segment splitting.

After openai/whisper ``decoding.py`` (``SuppressBlank``, ``SuppressTokens``, ``ApplyTimestampRules``, greedy,
sampling and beam search with a maximum-likelihood ranker) and ``transcribe.py`` (``decode_with_fallback``), run
over :class:`~streamer.engine.runtime.WhisperRuntime` with its preallocated KV cache.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from streamer.engine.filters import LogitFilters
from streamer.engine.keywords import prompt_tokens
from streamer.engine.kvcache import CrossKV
from streamer.engine.runtime import WhisperRuntime
from streamer.engine.stopping import is_looping, token_budget
from streamer.engine.tokenizer import WhisperTokenizer
from streamer.engine.types import DecodeOptions

__all__ = ["Candidate", "Decoder", "Prepared", "WindowDecoding", "compression_ratio", "seeded_generator"]


def compression_ratio(text: str) -> float:
    """gzip-style compression ratio of ``text``: high values mean repetitive (looping) output."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def seeded_generator(device: torch.device | str = "cpu") -> torch.Generator:
    """The random generator a sampled decode draws from, on the device of the probabilities it samples (a CPU
    generator cannot drive ``torch.multinomial`` on a GPU), seeded so that the same window decodes the same way."""
    # torch.Generator() refuses to run before torch._prims.rng_prims has set its metaclass (torch 2.13). torch's own
    # import has done it, unless a one-shot command deferred torch's meta registrations (streamer.startup): this
    # import then brings them in first, so the first sampled decode pays for them, not every start.
    import torch._prims.rng_prims

    return torch.Generator(device=device).manual_seed(0)


@dataclass
class Candidate:
    """One decoded token sequence (sampled tokens only, without the end-of-text token)."""

    tokens: list[int]
    sum_logprob: float


@dataclass(frozen=True)
class Prepared:
    """Where one window's decoding starts."""

    language: str
    prefix: list[int]  # the start-of-transcript sequence (with <|notimestamps|> when asked)
    initial: list[int]  # prompt + prefix: the tokens fed before sampling
    sot_index: int  # position of <|startoftranscript|> in ``initial``
    sample_len: int  # at most this many tokens are sampled


@dataclass
class WindowDecoding:
    """The chosen result for one window, before segmentation."""

    tokens: list[int]
    text: str
    language: str
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float
    temperature: float
    decoder_passes: int
    prefix: list[int] = field(default_factory=list)  # the sot sequence used (without the prompt)
    # probability of each token when it was chosen (greedy path), or None where the decoder did not keep them
    token_probs: list[float] | None = None


class Decoder:
    """Turns one window's encoder states into tokens. One instance per loaded model; not thread-safe."""

    def __init__(self, runtime: WhisperRuntime, tokenizer: WhisperTokenizer, suppress: tuple[int, ...],
                 suppress_begin: tuple[int, ...]) -> None:  # fmt: skip
        self.rt = runtime
        self.tok = tokenizer
        self.filters = LogitFilters(tokenizer, suppress, suppress_begin, runtime.config.vocab_size)
        self.passes = 0

    # -- language -----------------------------------------------------------------------------------------------
    def detect_language(self, cross: CrossKV) -> str:
        """The most likely language of the window (multilingual models)."""
        if not self.tok.multilingual:
            return "en"
        cache = self.rt.new_cache(1)
        logits, _ = self.rt.decode_step(torch.tensor([[self.tok.special.sot]]), cache, cross)
        self.passes += 1
        codes = list(self.tok.language_tokens)
        ids = torch.tensor([self.tok.language_tokens[c] for c in codes])
        return codes[int(logits[0, -1, ids].argmax())]

    # -- the fallback loop --------------------------------------------------------------------------------------
    def prepare(self, cross: CrossKV, options: DecodeOptions, prompt: str, num_samples: int | None = None) -> Prepared:
        """The tokens a window's decoding starts from (detecting the language first if it is not given), and how
        many it may sample (``num_samples``: the window's length, for ``options.max_tokens_per_second``). The
        prompt is the session's (``options.keywords`` and ``initial_prompt``) then ``prompt``, the committed text."""
        language = options.language or self.detect_language(cross)
        prefix = list(self.tok.sot_sequence(language, options.task))
        if options.without_timestamps:
            prefix.append(self.tok.special.no_timestamps)
        # the session's glossary and initial prompt, then the committed text (streamer.engine.keywords)
        encoded = prompt_tokens(self.tok.encode, options, prompt)
        previous = [self.tok.special.sot_prev, *encoded] if encoded else []
        initial = previous + prefix
        sample_len = token_budget(options, num_samples, self.rt.n_ctx - len(initial))
        return Prepared(language, prefix, initial, len(previous), sample_len)

    def result(
        self,
        prepared: Prepared,
        tokens: list[int],
        sum_logprob: float,
        no_speech: float,
        temperature: float,
        passes: int,
        token_probs: list[float] | None = None,
    ) -> WindowDecoding:
        text = self.tok.decode(tokens)
        return WindowDecoding(
            tokens=tokens,
            text=text,
            language=prepared.language,
            avg_logprob=sum_logprob / (len(tokens) + 1),
            no_speech_prob=no_speech,
            compression_ratio=compression_ratio(text),
            temperature=temperature,
            decoder_passes=passes,
            prefix=prepared.prefix,
            token_probs=token_probs,
        )

    def decode(
        self, cross: CrossKV, options: DecodeOptions, prompt: str, prepared: Prepared | None = None
    ) -> WindowDecoding:
        """Decode with temperature fallback (openai/whisper ``decode_with_fallback``) over
        ``options.temperatures``; the result of the last temperature tried is returned."""
        self.passes = 0
        prepared = prepared or self.prepare(cross, options, prompt)
        result: WindowDecoding | None = None
        for temperature in options.temperatures:
            candidates, no_speech = self._run(
                cross, prepared.initial, prepared.sot_index, prepared.sample_len, temperature, options
            )
            best = max(candidates, key=lambda c: c.sum_logprob / max(len(c.tokens), 1))
            result = self.result(prepared, best.tokens, best.sum_logprob, no_speech, temperature, self.passes)
            if not self.needs_fallback(result, options):
                break
        assert result is not None
        return result

    @staticmethod
    def needs_fallback(result: WindowDecoding, options: DecodeOptions) -> bool:
        if options.no_speech_threshold is not None and result.no_speech_prob > options.no_speech_threshold:
            return False  # silence: a higher temperature will not find speech
        if options.compression_ratio_threshold is not None and (
            result.compression_ratio > options.compression_ratio_threshold
        ):
            return True
        return options.logprob_threshold is not None and result.avg_logprob < options.logprob_threshold

    # -- one temperature ----------------------------------------------------------------------------------------
    def _run(
        self,
        cross: CrossKV,
        initial: list[int],
        sot_index: int,
        sample_len: int,
        temperature: float,
        options: DecodeOptions,
    ) -> tuple[list[Candidate], float]:
        beam = temperature == 0 and options.beam_size > 1
        rows = options.beam_size if beam else (options.best_of if temperature > 0 else 1)
        cache = self.rt.new_cache(rows)
        row_cross = cross.expand(rows) if cross.keys[0].shape[0] == 1 else cross
        logits, _ = self.rt.decode_step(torch.tensor([initial] * rows), cache, row_cross)
        self.passes += 1
        no_speech = float(logits[0, sot_index].softmax(-1)[self.tok.special.no_speech])

        sequences: list[list[int]] = [[] for _ in range(rows)]
        sum_logprobs = [0.0] * rows
        finished: list[Candidate] = []
        eot = self.tok.special.eot
        last = logits[:, -1]
        generator = seeded_generator(last.device)
        for _ in range(sample_len):
            last = last.clone()
            self.filters.apply(last, sequences, options)
            logprobs = F.log_softmax(last, dim=-1)
            if beam:
                next_tokens, sources, sequences, sum_logprobs = self._beam_step(
                    logprobs, sequences, sum_logprobs, finished, options.beam_size
                )
                if len(finished) >= options.beam_size or not next_tokens:
                    break
                cache.reorder(torch.tensor(sources))
            else:
                if temperature > 0:
                    probs = F.softmax(last / temperature, dim=-1)
                    chosen = torch.multinomial(probs, 1, generator=generator).squeeze(1)
                else:
                    chosen = last.argmax(dim=-1)
                next_tokens = chosen.tolist()
                for row, token in enumerate(next_tokens):
                    if sequences[row] and sequences[row][-1] == eot:
                        next_tokens[row] = eot
                        continue
                    sum_logprobs[row] += float(logprobs[row, token])
                    sequences[row].append(token)
                    if token < eot and is_looping([t for t in sequences[row] if t < eot], options.stop_on_repeats):
                        sequences[row].append(eot)  # a loop: stop this row as if it had ended
                if all(s and s[-1] == eot for s in sequences):
                    break
            if cache.length + 1 > self.rt.n_ctx:
                break
            logits, _ = self.rt.decode_step(torch.tensor(next_tokens).unsqueeze(1), cache, row_cross)
            self.passes += 1
            last = logits[:, -1]
        if beam:
            if len(finished) < options.beam_size:  # unfinished beams still count, best first
                order = sorted(range(len(sequences)), key=lambda i: sum_logprobs[i], reverse=True)
                finished.extend(Candidate(sequences[i], sum_logprobs[i]) for i in order)
            candidates = finished[: options.beam_size]
        else:
            candidates = [
                Candidate([t for t in s if t != eot], lp) for s, lp in zip(sequences, sum_logprobs, strict=True)
            ]

        return candidates, no_speech

    def _beam_step(
        self,
        logprobs: torch.Tensor,
        sequences: list[list[int]],
        sum_logprobs: list[float],
        finished: list[Candidate],
        beam_size: int,
    ) -> tuple[list[int], list[int], list[list[int]], list[float]]:
        """One step of openai/whisper's ``BeamSearchDecoder`` (patience 1) for one window."""
        eot = self.tok.special.eot
        scores: dict[tuple[int, ...], tuple[float, int]] = {}
        for row, seq in enumerate(sequences):
            top_lp, top_tok = logprobs[row].topk(beam_size + 1)
            for lp, token in zip(top_lp.tolist(), top_tok.tolist(), strict=True):
                scores[(*seq, token)] = (sum_logprobs[row] + lp, row)
        next_tokens: list[int] = []
        sources: list[int] = []
        new_sequences: list[list[int]] = []
        new_logprobs: list[float] = []
        for key in sorted(scores, key=lambda s: scores[s][0], reverse=True):
            score, row = scores[key]
            seq = list(key)
            if seq[-1] == eot:
                if len(finished) < beam_size:
                    finished.append(Candidate(list(seq[:-1]), score))
                continue
            next_tokens.append(seq[-1])
            sources.append(row)
            new_sequences.append(list(seq))
            new_logprobs.append(score)
            if len(next_tokens) == beam_size:
                break
        return next_tokens, sources, new_sequences, new_logprobs
