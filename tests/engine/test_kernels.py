"""The kernel class and the default encoder precision follow what torch's kernels run here, on every class.

The selection is a pure function of (CPU class, oneDNN cap, bf16 probe), tested for every class on any machine; the
tests marked ``kernels`` also run under forced kernel variants (``.ci/kernel-variants``), where the detection itself
must agree with the cap that was set.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from streamer.core.errors import ConfigError
from streamer.engine import CONFIGS, EngineOptions, load_engine
from streamer.engine.kernels import (
    DEFAULT_ENCODER,
    CpuFeatures,
    KernelClass,
    bf16_linear_runs,
    kernel_report,
    onednn_cap,
    select_encoder_precision,
    use_threads,
)

ZEN4 = CpuFeatures(avx2=True, avx512=True, vnni=True, bf16=True, amx=False)
SAPPHIRE_RAPIDS = CpuFeatures(avx2=True, avx512=True, vnni=True, bf16=True, amx=True)
CASCADE_LAKE = CpuFeatures(avx2=True, avx512=True, vnni=True, bf16=False, amx=False)
SKYLAKE_X = CpuFeatures(avx2=True, avx512=True, vnni=False, bf16=False, amx=False)
ZEN3 = CpuFeatures(avx2=True, avx512=False, vnni=False, bf16=False, amx=False)


@pytest.mark.parametrize(
    ("cpu", "expected"),
    [
        (SAPPHIRE_RAPIDS, KernelClass.AMX),
        (ZEN4, KernelClass.AVX512_BF16),
        (CASCADE_LAKE, KernelClass.AVX512_VNNI),
        (SKYLAKE_X, KernelClass.AVX512),
        (ZEN3, KernelClass.AVX2),
        (CpuFeatures(avx2=False, avx512=False, vnni=False, bf16=False, amx=False), KernelClass.GENERIC),
    ],
)
def test_the_cpu_class_is_the_highest_its_features_reach(cpu: CpuFeatures, expected: KernelClass) -> None:
    assert cpu.kernel_class is expected


@pytest.mark.parametrize(
    ("cpu", "cap", "runs", "expected"),
    [
        # bf16 only where bf16 dot products run: AMX and AVX512-BF16, allowed by the cap, and the probe ran
        (SAPPHIRE_RAPIDS, KernelClass.AMX, True, (KernelClass.AMX, "bf16")),
        (ZEN4, KernelClass.AMX, True, (KernelClass.AVX512_BF16, "bf16")),
        (CASCADE_LAKE, KernelClass.AMX, False, (KernelClass.AVX512_VNNI, "int8")),
        (SKYLAKE_X, KernelClass.AMX, False, (KernelClass.AVX512, "int8")),
        (ZEN3, KernelClass.AMX, False, (KernelClass.AVX2, "int8")),
        # a cap keeps the lower class: a bf16 CPU in a VM limited to AVX2 runs the INT8 encoder (issue 19's crash)
        (ZEN4, KernelClass.AVX2, True, (KernelClass.AVX2, "int8")),
        (SAPPHIRE_RAPIDS, KernelClass.AVX512_BF16, True, (KernelClass.AVX512_BF16, "bf16")),
        (SAPPHIRE_RAPIDS, KernelClass.AVX512_VNNI, True, (KernelClass.AVX512_VNNI, "int8")),
        # the flags say bf16 but a bf16 Linear fails (hidden by a hypervisor): the class drops below bf16
        (ZEN4, KernelClass.AMX, False, (KernelClass.AVX512_VNNI, "int8")),
        (SAPPHIRE_RAPIDS, KernelClass.AMX, False, (KernelClass.AVX512_VNNI, "int8")),
    ],
)
def test_the_default_encoder_follows_the_kernels_not_the_flags(
    cpu: CpuFeatures, cap: KernelClass, runs: bool, expected: tuple[KernelClass, str]
) -> None:
    assert select_encoder_precision(cpu.kernel_class, cap, runs) == expected


def test_every_class_has_a_default_and_bf16_needs_bf16_dot_products() -> None:
    assert set(DEFAULT_ENCODER) == set(KernelClass)
    assert {c for c, p in DEFAULT_ENCODER.items() if p == "bf16"} == {KernelClass.AVX512_BF16, KernelClass.AMX}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, (None, KernelClass.AMX)),
        ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, ("AVX2", KernelClass.AVX2)),
        ({"ONEDNN_MAX_CPU_ISA": "avx512_core"}, ("avx512_core", KernelClass.AVX512)),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}, ("AVX512_CORE_VNNI", KernelClass.AVX512_VNNI)),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, ("AVX512_CORE_BF16", KernelClass.AVX512_BF16)),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, ("AVX512_CORE_AMX", KernelClass.AMX)),
        ({"DNNL_MAX_CPU_ISA": "AVX2_VNNI"}, ("AVX2_VNNI", KernelClass.AVX2)),
        # the newer name wins over the older one, as in oneDNN
        ({"ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "ALL"}, ("AVX2", KernelClass.AVX2)),
        # a name oneDNN does not know is ignored by oneDNN too
        ({"ONEDNN_MAX_CPU_ISA": "NOT_AN_ISA"}, ("NOT_AN_ISA", KernelClass.AMX)),
    ],
)
def test_the_onednn_cap_is_read_as_onednn_reads_it(
    environ: dict[str, str], expected: tuple[str | None, KernelClass]
) -> None:
    assert onednn_cap(environ) == expected


def test_kernel_classes_parse_from_their_labels() -> None:
    assert [KernelClass.parse(c.label) for c in KernelClass] == list(KernelClass)
    assert KernelClass.parse("AVX512_BF16") is KernelClass.AVX512_BF16
    with pytest.raises(ValueError, match="one of generic, avx2"):
        KernelClass.parse("sse2")


def test_the_report_names_the_cpu_its_features_and_versions() -> None:
    report = kernel_report()
    line = report.describe()
    assert report.model in line and f"class {report.kernel_class.label}" in line
    assert f"torch {report.torch_version}" in line and "oneDNN " in line and report.onednn_version != "unknown"
    assert report.kernel_class <= min(report.cpu_class, onednn_cap()[1])


@pytest.mark.kernels
def test_detection_agrees_with_the_kernels_that_run_here() -> None:
    """Under any forced variant: bf16 is the default exactly where a bf16 Linear runs and the cap allows it."""
    report = kernel_report()
    allowed = min(report.cpu_class, onednn_cap()[1]) >= KernelClass.AVX512_BF16
    assert (report.default_encoder == "bf16") == (allowed and bf16_linear_runs())
    if onednn_cap()[1] < KernelClass.AVX512_BF16:
        assert report.default_encoder == "int8"


@pytest.mark.kernels
def test_int8_products_are_exact_wherever_vnni_runs() -> None:
    """Under any forced variant: the VNNI classes sum INT8 products in int32; where they clip, the report says so."""
    report = kernel_report()
    if report.kernel_class >= KernelClass.AVX512_VNNI:
        assert report.int8_exact
    assert ("INT8 GEMM saturates" in report.describe()) is not report.int8_exact


@pytest.mark.model
@pytest.mark.kernels
def test_bf16_asked_for_where_it_cannot_run_is_refused_clearly() -> None:
    options = replace(CONFIGS["bf16-encoder"], warmup=False)
    if bf16_linear_runs():
        assert load_engine("tiny.en", options).info.encoder == "bf16/cpu"
    else:
        with pytest.raises(ConfigError, match="encoder precision bf16: torch's bf16 kernels do not run"):
            load_engine("tiny.en", options)


@pytest.mark.model
def test_a_default_that_fails_its_warm_up_falls_back_to_int8(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import streamer.engine as engine_package
    from streamer.engine.whisper import WhisperEngine

    real_warmup = WhisperEngine.warmup

    def failing_warmup(self: WhisperEngine) -> None:
        if self.info.encoder.startswith("bf16"):
            raise RuntimeError("could not create a primitive descriptor for the inner product forward primitive")
        real_warmup(self)

    monkeypatch.setattr(engine_package, "default_encoder_precision", lambda cuda: "bf16")
    monkeypatch.setattr(engine_package, "_refuse_bf16_without_kernels", lambda options: None)
    monkeypatch.setattr(WhisperEngine, "warmup", failing_warmup)
    with caplog.at_level(logging.WARNING, logger="streamer.engine"):
        engine = load_engine("tiny.en", EngineOptions())
    assert engine.info.encoder == "int8/cpu"
    assert "the default bf16 encoder failed its warm-up on this CPU" in caplog.text
    # an encoder the caller chose is never swapped behind their back
    with pytest.raises(RuntimeError, match="primitive descriptor"):
        load_engine("tiny.en", EngineOptions(encoder_precision="bf16"))


@pytest.mark.model
def test_without_a_warm_up_a_default_that_fails_its_probe_falls_back_to_int8(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The one-shot `transcribe` skips the warm-up decode; the probe keeps the fallback it guaranteed."""
    import streamer.engine as engine_package
    from streamer.engine.runtime import WhisperRuntime
    from streamer.engine.whisper import WhisperEngine

    real_probe = WhisperRuntime.probe

    def failing_probe(self: WhisperRuntime) -> None:
        if str(self.encoder_placement).startswith("bf16"):
            raise RuntimeError("could not create a primitive descriptor for the inner product forward primitive")
        real_probe(self)

    def no_warmup(self: WhisperEngine) -> None:
        raise AssertionError("warmup=False ran a warm-up decode")

    monkeypatch.setattr(engine_package, "default_encoder_precision", lambda cuda: "bf16")
    monkeypatch.setattr(engine_package, "_refuse_bf16_without_kernels", lambda options: None)
    monkeypatch.setattr(WhisperRuntime, "probe", failing_probe)
    monkeypatch.setattr(WhisperEngine, "warmup", no_warmup)
    with caplog.at_level(logging.WARNING, logger="streamer.engine"):
        engine = load_engine("tiny.en", EngineOptions(warmup=False))
    assert engine.info.encoder == "int8/cpu"
    assert "the default bf16 encoder failed its probe on this CPU" in caplog.text
    with pytest.raises(RuntimeError, match="primitive descriptor"):
        load_engine("tiny.en", EngineOptions(encoder_precision="bf16", warmup=False))


@pytest.mark.model
@pytest.mark.kernels
def test_the_probe_fails_exactly_where_the_warm_up_does() -> None:
    """A bf16 encoder, forced past the refusal: under an oneDNN cap below bf16 both raise, elsewhere neither does."""
    from streamer.engine.models import prepare
    from streamer.engine.runtime import Placement, Precision
    from streamer.engine.whisper import WhisperEngine

    engine = WhisperEngine(prepare("tiny.en"), Placement(Precision.BF16, "cpu"), Placement(Precision.FP32, "cpu"))
    outcomes = []
    for check in (engine.probe, engine.warmup):
        try:
            check()
            outcomes.append("ran")
        except RuntimeError as error:
            outcomes.append(str(error).splitlines()[0])
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0] == "ran") == bf16_linear_runs()


def test_the_spin_count_is_limited_on_taken_cores_for_a_fresh_process_and_a_users_choice_kept() -> None:
    import subprocess
    import sys

    from streamer.engine.kernels import OPENMP_SPIN_COUNT

    script = (
        "import os, sys; from streamer.engine.kernels import limit_openmp_spinning as limit\n"
        "cores = len(os.sched_getaffinity(0))\n"
        "elsewhere = {'busy': 1, 'idle': 0, 'unknown': None}[sys.argv[1]]\n"
        "print(limit(cores, None, elsewhere), os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))\n"
        "if sys.argv[2:]: import torch; os.environ.pop('GOMP_SPINCOUNT'); print(limit(cores, None, 1))"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}

    def run(extra: dict[str, str], *argv: str) -> list[str]:
        command = [sys.executable, "-c", script, *argv]
        result = subprocess.run(command, env={**clean, **extra}, capture_output=True, text=True, check=True)
        return result.stdout.split()

    # one task beside a thread per core: limited; once torch (and libgomp with it) is loaded it is too late
    assert run({}, "busy", "then-torch") == ["True", OPENMP_SPIN_COUNT, "None", "False"]
    assert run({}, "idle") == ["False", "None", "None"]  # free cores: libgomp's own spin
    assert run({}, "unknown") == ["True", OPENMP_SPIN_COUNT, "None"]  # no /proc/loadavg: the safe side
    assert run({"GOMP_SPINCOUNT": "5"}, "busy") == ["False", "5", "None"]
    assert run({"OMP_WAIT_POLICY": "active"}, "busy") == ["False", "None", "active"]


def test_fewer_threads_leave_room_for_other_work() -> None:
    from streamer.engine.kernels import cores_taken

    assert [cores_taken(t, e, 2) for t, e in [(1, 1), (1, 2), (2, 0), (2, 1)]] == [False, True, False, True]
    assert not cores_taken(4, 12, 16) and cores_taken(4, 13, 16)
    assert cores_taken(1, None, 64)  # unknown: taken


def test_the_tasks_runnable_elsewhere_are_the_least_of_a_few_reads(tmp_path: Path) -> None:
    from streamer.engine.kernels import runnable_elsewhere

    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.52 0.61 0.70 3/412 99812\n")
    assert runnable_elsewhere(3, loadavg) == 2  # this process is one of the 3
    loadavg.write_text("0.52 0.61 0.70 1/412 99812\n")
    assert runnable_elsewhere(1, loadavg) == 0
    loadavg.write_text("garbled\n")
    assert runnable_elsewhere(2, loadavg) is None
    assert runnable_elsewhere(1, tmp_path / "absent") is None
    assert (runnable_elsewhere() or 0) >= 0  # this machine's own, where Linux has it


def test_a_thread_takes_its_own_torch_threads_and_only_when_they_change() -> None:
    torch = pytest.importorskip("torch")
    with ThreadPoolExecutor(max_workers=1) as engine_thread:
        before = torch.get_num_threads()
        engine_thread.submit(use_threads, 2).result()
        assert engine_thread.submit(use_threads, 1).result()  # 2 to 1: changed
        assert engine_thread.submit(torch.get_num_threads).result() == 1
        assert not engine_thread.submit(use_threads, 1).result()  # already 1: nothing to do
        assert torch.get_num_threads() == before  # the caller's thread keeps its own
    with pytest.raises(ValueError, match="at least 1"):
        use_threads(0)
