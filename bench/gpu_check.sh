#!/usr/bin/env bash
# The CUDA op timer's checks on a GPU (the README's "CUDA" section), in one go on a fresh machine
# with an NVIDIA GPU, its own CUDA toolkit and no network:
#
#   bash bench/gpu_check.sh pack        # here, with the network: .gpu-pack/ (about 45 MiB): the
#                                       # patched llama.cpp source, the CUPTI tracer's source, and
#                                       # wheels of the Python packages a bare machine may lack
#   bash bench/gpu_check.sh run [OUT]   # there, from a copy of this working tree with .gpu-pack/
#                                       # (the device tool: carry=[".gpu-pack"]): OUT or $OUT
#
# `run` builds the patched libraries and llama-bench with ggml's CUDA backend for CUDA_ARCH
# (default 90: H100, H200; about 5 minutes on 16 cores), writing a random-weight model with
# Llama-3.2-1B's shapes meanwhile (Q4_K_M after the build), then, every layer offloaded, CUDA
# graphs on:
#   1. decode tokens/s with no session, at MINIMAL and at DETAILED, alternated in one process,
#      with the greedy text and every step's logits compared (targets: MINIMAL >= 0.99x,
#      DETAILED >= 0.92x; text and logits identical);
#   2. the summary's prompt and generation tokens/s of a MINIMAL run against llama-bench's
#      (target: within 10 %), and a DETAILED run's log;
#   3. each op type's GPU time against CUPTI's kernel records of the same run, and the ops' cover
#      of each graph compute (targets: within 10 %, cover >= 0.90);
#   4. the CUDA logs to commit as fixtures: every layer offloaded, half of them, a MoE with its
#      experts on the CPU.
# It prints the figures and writes them to OUT/gpu_check.json, beside the logs. Steps that fail
# are reported and the others still run; the exit status is that of the first failure.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PACK=$ROOT/.gpu-pack
# the project's and llama-cpp-python's dependencies beside numpy and pandas (pyproject.toml)
WHEELS="click orjson gguf rich markdown-it-py mdurl pygments isal prometheus-client typing-extensions
diskcache jinja2 markupsafe perfetto pyyaml"
t0=$SECONDS
step() { echo "### [$((SECONDS - t0))s] $*"; }

pack() {
    set -e
    rm -rf "$PACK" && mkdir -p "$PACK/whl"
    local tmp
    tmp=$(mktemp -d)
    python - "$tmp" <<'PY'
import sys
from pathlib import Path
from llamacpp_instr.native import build, pin
tmp = Path(sys.argv[1])
plan = build.make_plan()
root = build.prepare_source(plan, tmp / "src", lambda m: None)
(tmp / "patch_hash").write_text(build.source_patch_hash())
(tmp / "root").write_text(str(root))
PY
    local root name v
    root=$(cat "$tmp/root")
    name=$(basename "$root")
    v=$name/vendor/llama.cpp
    # the sdist is 73 MB: the models, docs, tests and web UI stay here
    tar -C "$(dirname "$root")" -cJf "$PACK/src.tar.xz" \
        --exclude="$v/models" --exclude="$v/docs" --exclude="$v/media" --exclude="$v/benches" \
        --exclude="$v/tests" --exclude="$v/examples" --exclude="$v/gguf-py" --exclude="$v/scripts" \
        --exclude="$v/conversion" --exclude="$v/tools/server/public" --exclude="$name/examples" "$name"
    cp "$tmp/patch_hash" "$PACK/patch_hash"
    rm -rf "$tmp"
    # the packages a bare Python may lack (numpy and pandas it must have), for the Pythons it may be
    for v in 3.10 3.11 3.12 3.13; do
        python -m pip download -q --no-deps --only-binary=:all: --python-version "$v" \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform any -d "$PACK/whl" $WHEELS >/dev/null  # (split on purpose)
    done
    du -sh "$PACK"
}

run() {
    local out=${1:-${OUT:-$ROOT/gpu-check-out}}
    local arch=${CUDA_ARCH:-90} w=/tmp/gpu-check rc=0
    mkdir -p "$out" "$w"
    fail() { echo "### FAILED: $*" >&2; [ "$rc" -ne 0 ] || rc=1; }
    [ -f "$PACK/src.tar.xz" ] || { echo "error: $PACK/src.tar.xz missing: run 'bash bench/gpu_check.sh pack' first" >&2; exit 2; }
    nvidia-smi -L || true
    local cuda
    cuda=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")")

    step "unpack; build the CUDA libraries and llama-bench for sm_$arch in the background ($cuda)"
    rm -rf "$w/src" && mkdir -p "$w/src" && tar xJf "$PACK/src.tar.xz" -C "$w/src"
    local sdist vendor
    sdist=$(echo "$w"/src/llama_cpp_python-*)
    vendor=$sdist/vendor/llama.cpp
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    (cmake -S "$vendor" -B "$w/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DGGML_NATIVE=ON -DGGML_RPC=ON \
        -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_INSTR_PATCH_HASH="$(cat "$PACK/patch_hash")" -DLLAMA_INSTR_LLAMA_COMMIT=0c1e570 \
        && cmake --build "$w/build" -j "$(nproc)" --target llama ggml ggml-rpc llama-bench) \
        >"$w/build.log" 2>&1 &
    local build_pid=$!

    step "Python packages; the CUPTI tracer; the models' F16 weights (beside the build)"
    # shellcheck disable=SC2086
    python3 -m pip install -q --no-index --no-deps --find-links "$PACK/whl" --target "$w/site" $WHEELS \
        >/dev/null 2>&1 || fail "pip install of the carried wheels"
    python3 -c "import numpy, pandas" || { echo "error: this Python lacks numpy or pandas" >&2; exit 2; }
    export PYTHONPATH=$ROOT:$sdist:$w/site
    g++ -shared -fPIC -O2 -std=c++17 -I"$cuda/include" bench/cupti_trace.cpp \
        -L"$cuda/lib64" -L"$cuda/extras/CUPTI/lib64" -Wl,-rpath,"$cuda/lib64:$cuda/extras/CUPTI/lib64" -lcupti \
        -o "$w/cupti_trace.so" || fail "CUPTI tracer"
    [ -f "$w/l1b-f16.gguf" ] || python3 bench/gpu_check.py model "$w/l1b-f16.gguf" >/dev/null || fail "model"
    [ -f "$w/moe.gguf" ] || python3 bench/gpu_check.py moe-model "$w/moe.gguf" >/dev/null || fail "MoE model"

    wait "$build_pid" || { tail -20 "$w/build.log"; echo "### the build failed" >&2; exit 1; }
    grep -o '\[[0-9]*/[0-9]*\]' "$w/build.log" | tail -1
    export LLAMA_CPP_LIB_PATH=$w/build/bin
    local bench=$w/build/bin/llama-bench
    [ -f "$w/l1b.gguf" ] || python3 bench/gpu_check.py quantize "$w/l1b-f16.gguf" "$w/l1b.gguf" >/dev/null || fail "quantize"
    python3 -m llamacpp_instr.cli doctor || fail "instr doctor"

    step "1. decode tokens/s with no session, MINIMAL, DETAILED (one process, alternated); text and logits"
    python3 bench/gpu_check.py --json "$out/levels.json" levels "$w/l1b.gguf" "$out/levels" -n 128 --rounds 5 \
        || fail "levels"

    step "2. the summary's tokens/s against llama-bench's"
    yes "The quick brown fox jumps over the lazy dog." | head -40 >"$w/prompt.txt"
    local lv
    for lv in minimal detailed; do
        python3 -m llamacpp_instr.cli run "$w/l1b.gguf" --prompt-file "$w/prompt.txt" -n 128 --ignore-eos \
            -ngl all --batch 512 --ubatch 512 --no-flash-attn --level "$lv" -o "$out/cuda-full-$lv.log" \
            >/dev/null || fail "instr run --level $lv (every layer offloaded)"
    done
    local p
    p=$(python3 -c "
from llamacpp_instr.converters import load_session
from llamacpp_instr.converters.reports.summary import overview
print(int(overview(load_session('$out/cuda-full-minimal.log'))['prompt_tokens']))") || p=128
    "$bench" -m "$w/l1b.gguf" -ngl 99 -fa 0 -b 512 -ub 512 -r 3 -o json -p "$p" -n 0 >"$w/pp.json" \
        && "$bench" -m "$w/l1b.gguf" -ngl 99 -fa 0 -b 512 -ub 512 -r 3 -o json -p 0 -n 128 -d "$p" >"$w/tg.json" \
        && python3 -c "import json; print(json.dumps(json.load(open('$w/pp.json')) + json.load(open('$w/tg.json'))))" >"$w/bench.json" \
        && python3 bench/gpu_check.py --json "$out/headline.json" headline "$out/cuda-full-minimal.log" "$w/bench.json" \
        || fail "headline against llama-bench"

    step "3. per-op GPU time against CUPTI's kernels (the same kind of run, traced)"
    CUPTI_TRACE_OUT=$w/kernels.txt LD_PRELOAD=$w/cupti_trace.so python3 -m llamacpp_instr.cli run "$w/l1b.gguf" \
        --prompt-file "$w/prompt.txt" -n 32 --ignore-eos -ngl all --no-flash-attn -o "$out/cupti-detailed.log" >/dev/null \
        && python3 bench/cupti_join.py "$w/kernels.txt" "$out/cupti-detailed.log" | tee "$out/cupti.txt" \
        || fail "CUPTI join"

    step "4. the logs to commit: half the layers offloaded; a MoE with its experts on the CPU"
    python3 -m llamacpp_instr.cli run "$w/l1b.gguf" --prompt-file "$w/prompt.txt" -n 16 --ignore-eos \
        -ngl 8 --no-flash-attn -o "$out/cuda-half-detailed.log" >/dev/null || fail "instr run -ngl 8"
    python3 -m llamacpp_instr.cli run "$w/moe.gguf" --prompt-file "$w/prompt.txt" -n 16 --ignore-eos \
        -ngl all --n-cpu-moe 4 --no-flash-attn -o "$out/cuda-moe-ncmoe4-detailed.log" >/dev/null \
        || fail "instr run --n-cpu-moe 4"
    for f in "$out"/cuda-*.log; do
        [ -f "$f" ] && python3 -m llamacpp_instr.cli summary "$f" | head -25
    done

    python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
figures = {p.stem: json.loads(p.read_text()) for p in (out / "levels.json", out / "headline.json") if p.is_file()}
if (out / "cupti.txt").is_file():
    figures["cupti"] = json.loads((out / "cupti.txt").read_text().strip().splitlines()[-1])
(out / "gpu_check.json").write_text(json.dumps(figures, indent=1) + "\n")
lv, hd, cu = figures.get("levels", {}), figures.get("headline", {}), figures.get("cupti", {})
print("### figures")
print(f"MINIMAL {lv.get('minimal_ratio')}x (>= 0.99), DETAILED {lv.get('detailed_ratio')}x (>= 0.92) of no session")
print(f"text identical {lv.get('text_identical')}; logits bit-identical {lv.get('logits_bit_identical')}")
print(f"summary / llama-bench: prompt {hd.get('prompt_ratio')}, generation {hd.get('gen_ratio')} (0.90-1.10)")
print(f"op types within 10 % of CUPTI: {cu.get('op_types_within_10pct')}/{cu.get('op_types_total')}; "
      f"cover min {cu.get('coverage_min')} (>= 0.90)")
PY
    step "done (logs and figures in $out)"
    return "$rc"
}

case "${1:-}" in
pack) pack ;;
run) run "${2:-}" ;;
*) sed -n 2,27p "$0"; exit 2 ;;
esac
