from __future__ import annotations

from dataclasses import replace

import pytest

from streamer.engine import kernels
from streamer.engine.kernels import KernelClass, kernel_report
from streamer.engine.models import prepare
from streamer.engine.network import Attention
from streamer.engine.runtime import (
    CPU_BF16_ATTENTION_BLOCK,
    Placement,
    Precision,
    WhisperRuntime,
    encoder_attention_block,
)


@pytest.mark.parametrize("kernel_class", list(KernelClass))
def test_the_encoder_attention_is_blocked_only_for_bf16_on_the_class_it_was_measured_on(
    kernel_class: KernelClass,
) -> None:
    for precision in Precision:
        for device in ("cpu", "cuda"):
            block = encoder_attention_block(kernel_class, Placement(precision, device))
            measured = kernel_class is KernelClass.AVX512_BF16 and precision is Precision.BF16 and device == "cpu"
            assert block == (CPU_BF16_ATTENTION_BLOCK if measured else None), (kernel_class, precision, device)


@pytest.mark.model
@pytest.mark.parametrize(
    ("kernel_class", "precision", "block"),
    [
        (KernelClass.AVX512_BF16, Precision.BF16, CPU_BF16_ATTENTION_BLOCK),
        (KernelClass.AMX, Precision.BF16, None),
        (KernelClass.AVX512_BF16, Precision.FP32, None),
    ],
)
def test_a_runtime_sets_its_encoder_attention_by_the_kernel_class(
    kernel_class: KernelClass, precision: Precision, block: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = replace(kernel_report(), kernel_class=kernel_class)
    monkeypatch.setattr(kernels, "kernel_report", lambda: report)
    runtime = WhisperRuntime(prepare("tiny.en"), Placement(precision, "cpu"), Placement(Precision.FP32, "cpu"))
    attentions = [m for m in runtime.encoder.modules() if isinstance(m, Attention)]
    assert len(attentions) == 4  # tiny.en's encoder layers
    assert {a.query_block for a in attentions} == {block}
