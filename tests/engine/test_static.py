"""Greedy decoding in static shapes (the GPU's path, issue 37) gives the CPU path's tokens, in the same passes, with
one host read per pass."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from streamer.core.units import SAMPLE_RATE
from streamer.engine import DecodeOptions, DecodeRequest, EngineOptions, StreamId, load_engine
from streamer.engine.greedy import GreedyOutcome
from streamer.engine.runtime import attention_backends
from streamer.engine.static import ROW_BUCKETS, row_bucket
from streamer.engine.whisper import WhisperEngine
from tests.conftest import load_clip

pytestmark = pytest.mark.model

STEP = SAMPLE_RATE
CLIPS = ("1089-134686-0000.flac", "121-127105-0000.flac", "1089-134686-0001.flac")


@pytest.fixture(scope="module")
def static_engine() -> Iterator[WhisperEngine]:
    engine = load_engine("tiny.en", EngineOptions(static_shapes=True, warmup=False))
    yield engine
    engine.close()


def _streamed(engine: WhisperEngine, tag: str, options: DecodeOptions, trim: int = 0) -> list[tuple[Any, ...]]:
    """Each clip streamed as its own stream, all three in one batch per update (a window a second, the buffer
    trimmed every ``trim`` samples so that drafts' timestamps shift): each window's tokens, passes and words."""
    clips = [load_clip(name) for name in CLIPS]
    out: list[tuple[Any, ...]] = []
    starts = [0] * len(clips)
    for end in range(2 * STEP, max(len(c) for c in clips) + 1, STEP):
        requests = []
        for index, clip in enumerate(clips):
            if end > len(clip):
                continue
            if trim and end - starts[index] > trim:
                starts[index] += trim // 2
            requests.append(
                DecodeRequest(
                    audio=clip[starts[index] : end],
                    options=options,
                    stream_id=StreamId(f"{tag}-{index}"),
                    stream_offset=starts[index],
                    request_id=index,
                )
            )
        for result in engine.decode(requests):
            words = [(w.word, w.start, w.end) for s in result.segments for w in s.words]
            out.append((result.tokens, result.decoder_passes, words))
    return out


@pytest.mark.kernels
def test_static_shapes_decode_token_for_token_as_the_cpu_path(
    tiny_engine: WhisperEngine, static_engine: WhisperEngine
) -> None:
    options = DecodeOptions(temperatures=(0.0,))
    decoded = 0
    for trim in (0, 6 * STEP):
        expected = _streamed(tiny_engine, f"cpu{trim}", options, trim)
        assert _streamed(static_engine, f"static{trim}", options, trim) == expected
        decoded += sum(len(tokens) for tokens, _, _ in expected)
    assert decoded > 600  # tokens compared: enough that a stray one would show


@pytest.mark.kernels
def test_static_shapes_keep_keywords_prompts_and_timestamp_free_decoding_exact(
    tiny_engine: WhisperEngine, static_engine: WhisperEngine
) -> None:
    for options in (
        DecodeOptions(temperatures=(0.0,), word_timestamps=False, without_timestamps=True),
        DecodeOptions(
            temperatures=(0.0,),
            word_timestamps=False,
            initial_prompt="A menu.",
            keywords=("flour-fattened", "Turnips", "ladle"),
            keyword_bonus=4.0,
        ),
    ):
        assert _streamed(static_engine, "s", options) == _streamed(tiny_engine, "c", options)
        for engine in (tiny_engine, static_engine):
            for index in range(len(CLIPS)):
                engine.forget_stream(StreamId(f"s-{index}"))
                engine.forget_stream(StreamId(f"c-{index}"))


def test_static_shapes_are_exact_after_a_prompt_of_half_the_context(
    tiny_engine: WhisperEngine, static_engine: WhisperEngine
) -> None:
    """The longest prompt a window takes (half the decoder's context), then "I'm sorry," on silence for as long as
    the model goes on (how long depends on the kernels: 223 tokens natively, 55 with an AVX2 machine's INT8
    encoder), twice, the second with the first as its draft."""
    audio = np.zeros(5 * SAMPLE_RATE, dtype=np.float32)
    options = DecodeOptions(temperatures=(0.0,), word_timestamps=False, no_speech_threshold=None)
    results = []
    for engine in (tiny_engine, static_engine):
        request = DecodeRequest(audio=audio, options=options, prompt="I'm sorry, " * 60, stream_id=StreamId("end"))
        results.append([engine.decode([request])[0] for _ in range(2)])
        engine.forget_stream(StreamId("end"))
    cpu, static = results
    assert [r.tokens for r in static] == [r.tokens for r in cpu]
    assert [r.decoder_passes for r in static] == [r.decoder_passes for r in cpu]
    assert cpu[0].text.count("sorry") > 10


def test_a_step_that_ends_at_the_last_position_keeps_its_padding_out_of_the_context(
    tiny_engine: WhisperEngine,
) -> None:
    """Two rows step from position 440: one with 8 real tokens (its last at 447, the context's last position), one
    with 1. Their padding lands past the context, in the scratch positions, and the real tokens' hidden states are
    those of the same tokens fed one row at a time through the CPU path's growing cache."""
    rt = tiny_engine.runtime
    cross = rt.cross_kv(rt.encode(torch.zeros(1, 80, 3000))).expand(2)
    prefix = [220 + k % 50 for k in range(440)]  # any tokens: the positions are the point
    steps = [[300 + k for k in range(8)], [400]]
    cache = rt.new_static_cache(2, scratch=32)
    rt.decode_static(torch.tensor([prefix, prefix]), torch.zeros(2, dtype=torch.long), torch.tensor([440, 440]),
                     cache, cross)  # fmt: skip
    tokens = torch.tensor([steps[0] + [0] * 17, steps[1] + [0] * 24])
    hidden = rt.decode_static(tokens, torch.tensor([440, 440]), torch.tensor([8, 1]), cache, cross)
    for row, step in enumerate(steps):
        alone = rt.new_cache(1)
        expected, _ = rt.decode_hidden(torch.tensor([prefix + step]), alone, cross.row(row))
        torch.testing.assert_close(hidden[row, : len(step)], expected[0, 440:], rtol=1e-4, atol=1e-4)


class _Reads(TorchDispatchMode):
    """Counts the operations that read a value back to the host (``item``, ``bool``, ``int``)."""

    def __init__(self) -> None:
        super().__init__()
        self.scalars = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            self.scalars += 1
        return func(*args, **(kwargs or {}))


def test_each_pass_reads_the_device_once(static_engine: WhisperEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted on the CPU, where a read is a ``tolist`` or a scalar conversion: one list per decoder pass (the
    choices), no scalar at all. On a GPU each is a synchronisation."""
    outcomes: list[list[GreedyOutcome]] = []
    lists = 0
    original_tolist = torch.Tensor.tolist
    decode = static_engine._greedy  # the engine's, with its buffers

    def counting_tolist(self: torch.Tensor) -> Any:
        nonlocal lists
        lists += 1
        return original_tolist(self)

    reads = _Reads()

    def inside(*args: Any) -> list[GreedyOutcome]:
        monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)
        try:
            with reads:
                result = decode(*args)
        finally:
            monkeypatch.setattr(torch.Tensor, "tolist", original_tolist)
        outcomes.append(result)
        return result

    monkeypatch.setattr(static_engine, "_greedy", inside)
    clips = [load_clip(name)[: 6 * STEP] for name in CLIPS]
    options = DecodeOptions(temperatures=(0.0,), word_timestamps=False)
    for end in (3 * STEP, 4 * STEP, 6 * STEP):  # drafts from the second window on
        requests = [
            DecodeRequest(audio=c[:end], options=options, stream_id=StreamId(f"reads-{i}"), request_id=i)
            for i, c in enumerate(clips)
        ]
        static_engine.decode(requests)
    passes = sum(max(o.passes for o in batch) for batch in outcomes)
    assert passes > 3 * len(outcomes)  # several passes a batch: the count below means something
    assert (lists, reads.scalars) == (passes, 0)


def test_buffers_grow_for_a_larger_batch_and_a_failed_graph_capture_falls_back(
    tiny_engine: WhisperEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """One window, then five (the buffers grow from 1 row to 8), then three: the CPU path's tokens each time. Graphs
    asked for where none can be captured (here, no CUDA): the step runs as it is, and the log says why, once."""
    engine = load_engine("tiny.en", EngineOptions(static_shapes=True, warmup=False))
    buffers = engine._greedy.keywords["buffers"]  # type: ignore[attr-defined]
    buffers.graphs = True  # as on a GPU: the first capture fails here
    clips = [load_clip(name) for name in CLIPS]
    windows = [c[start : start + 4 * STEP] for c in clips for start in (0, 2 * STEP)][:5]
    options = DecodeOptions(temperatures=(0.0,), word_timestamps=False)
    rows = []
    for batch in (windows[:1], windows, windows[2:]):
        requests = [DecodeRequest(audio=w, options=options, request_id=i) for i, w in enumerate(batch)]
        got = [r.tokens for r in engine.decode(requests)]
        assert got == [r.tokens for r in tiny_engine.decode(requests)]
        rows.append(buffers.rows)
    assert rows == [1, 8, 8]
    assert not buffers.graphs and not buffers.captured
    assert [r.message for r in caplog.records].count(
        "the decoder step could not be captured as a CUDA graph (torch.cuda.Stream requires CUDA support): running "
        "it without graphs"
    ) == 1
    engine.close()


def test_rows_round_up_to_few_batch_shapes() -> None:
    assert [row_bucket(n) for n in (1, 2, 3, 5, 8, 9, 100, 512, 513, 1100)] == [1, 2, 4, 8, 8, 16, 128, 512, 1024, 1536]
    assert all(row_bucket(bucket) == bucket for bucket in ROW_BUCKETS)


def test_on_cuda_attention_never_takes_cudnn_s_per_shape_plans() -> None:
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with attention_backends(torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with attention_backends(torch.device("cpu")):  # the CPU's choice is torch's
        assert torch.backends.cuda.cudnn_sdp_enabled() == before
