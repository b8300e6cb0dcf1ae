#!/usr/bin/env bash
# The CUDA op timer's checks on a GPU (the README's "CUDA" section), in one go on a fresh machine
# with an NVIDIA GPU, its own CUDA toolkit and no network:
#
#   bash bench/gpu_check.sh pack        # here, with the network: .gpu-pack/ (about 45 MiB): the
#                                       # patched llama.cpp source, the CUPTI tracer's source, and
#                                       # wheels of the Python packages a bare machine may lack
#   bash bench/gpu_check.sh pack --prebuilt BUILD
#                                       # instead of the source: the libraries and llama-bench of
#                                       # BUILD, a CMake build of the patched source with
#                                       # GGML_CUDA=ON made here (instr build --cuda's toolkit),
#                                       # with the CUDA runtime it was built against
#   bash bench/gpu_check.sh run [OUT]   # there, from a copy of this working tree with .gpu-pack/
#                                       # (the device tool: carry=[".gpu-pack"]): OUT or $OUT
#
# `run` builds the patched libraries and llama-bench with ggml's CUDA backend for CUDA_ARCH
# (default 90: H100, H200; about 4 minutes on 16 cores) unless the pack carries them built,
# writing a random-weight model with Llama-3.2-1B's shapes meanwhile (Q4_K_M after the build),
# then, every layer offloaded, CUDA graphs on (each run of instr preloads bench/segv_trace.c, so
# that a crash prints its native frames):
#   1. decode tokens/s with no session, at MINIMAL and at DETAILED, alternated in one process,
#      with the greedy text and every step's logits compared (targets: MINIMAL >= 0.99x,
#      DETAILED >= 0.92x; text and logits identical), through llama-cpp-python's Llama.eval and
#      through the C API (`phases`: where the cost lands: llama_decode, llama_synchronize, the
#      logits; MINIMAL also without device timing, without the step's memory figures);
#   2. the summary's prompt and generation tokens/s of a MINIMAL run against llama-bench's
#      (target: within 10 %), the run after one that loaded its kernels, as llama-bench warms up;
#   3. each op type's GPU time against CUPTI's kernel records of the same (warm) run, and the ops'
#      cover of each graph compute (targets: within 10 %, cover >= 0.90), with ggml's
#      programmatic launches on and off;
#   4. the CUDA logs to commit as fixtures: every layer offloaded (DETAILED, MINIMAL), half of
#      them, a MoE with its experts on the CPU.
# It prints the figures and writes them to OUT/gpu_check.json, the logs and CUPTI's traces to
# OUT/results.tgz (the device tool returns a few files). Steps that fail are reported and the
# others still run; the exit status is that of the first failure.
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
    if [ "${1:-}" = --prebuilt ]; then
        pack_prebuilt "$2"
    else
        pack_source
    fi
    # the packages a bare Python may lack (numpy and pandas it must have), for the Pythons it may be
    for v in 3.10 3.11 3.12 3.13; do
        python -m pip download -q --no-deps --only-binary=:all: --python-version "$v" \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform any -d "$PACK/whl" $WHEELS >/dev/null 2>&1  # (split on purpose)
    done
    du -sh "$PACK"
}

# the libraries of a CMake build (ggml-cuda, llama, the CPU and RPC backends), llama-bench, the
# CUDA runtime they were linked with (the GPU machine's driver runs a newer 13.x runtime), and
# llama-cpp-python's package from the same patched source
pack_prebuilt() {
    local build=$1 cache src cudart f so
    cache=$build/CMakeCache.txt
    [ -f "$build/bin/libggml-cuda.so" ] || { echo "error: $build/bin/libggml-cuda.so missing" >&2; exit 2; }
    src=$(grep -m1 '^CMAKE_HOME_DIRECTORY' "$cache" | cut -d= -f2)  # <sdist>/vendor/llama.cpp
    cudart=$(grep -m1 "^CUDA_cudart_LIBRARY:" "$cache" | cut -d= -f2).13
    # the logs it writes name the patch set by the hash the build was configured with: a build
    # of other sources than this tree's would label them falsely
    local built want
    built=$(grep -m1 '^LLAMA_INSTR_PATCH_HASH' "$cache" | cut -d= -f2)
    want=$(python -c "from llamacpp_instr.native import build; print(build.source_patch_hash())")
    [ "$built" = "$want" ] || {
        echo "error: $build was configured for patch hash $built, this tree's is $want: rebuild it" >&2
        exit 2
    }
    mkdir -p "$PACK/lib" "$PACK/py"
    # each library once, by the name that loads it (its soname; the run adds the .so links)
    for f in "$build"/bin/*.so; do
        so=$(readelf -d "$f" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
        cp -L "$f" "$PACK/lib/${so:-$(basename "$f")}"
    done
    cp -L "$build/bin/llama-bench" "$cudart" "$PACK/lib/"
    strip --strip-unneeded "$PACK"/lib/*.so*
    cp -a "$src/../../llama_cpp" "$PACK/py/"
    rm -rf "$PACK/py/llama_cpp/lib"
    echo "$built" >"$PACK/patch_hash"
}

pack_source() {
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
}

run() {
    local out=${1:-${OUT:-$ROOT/gpu-check-out}}
    local arch=${CUDA_ARCH:-90} w=/tmp/gpu-check rc=0
    # the models in memory where there is room (tmpfs writes the 2.9 GB F16 model fastest)
    [ -d /dev/shm ] && [ "$(df -Pk /dev/shm | awk 'NR==2 {print $4}')" -gt 8000000 ] && w=/dev/shm/gpu-check
    mkdir -p "$out" "$w"
    fail() { echo "### FAILED: $*" >&2; [ "$rc" -ne 0 ] || rc=1; }
    nvidia-smi -L || true
    grep -m1 PRETTY_NAME /etc/os-release; ldd --version | head -1; python3 --version
    local cuda lib build_pid=
    cuda=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")")
    export PYTHONPATH=$ROOT:$w/site
    if [ -d "$PACK/lib" ]; then
        step "the libraries and llama-bench as carried (built elsewhere; $cuda for cuBLAS)"
        lib=$w/lib
        rm -rf "$lib" && mkdir -p "$lib"
        ln -s "$PACK"/lib/* "$lib/"
        for f in "$PACK"/lib/lib*.so.[0-9]*; do
            ln -sf "$(basename "$f")" "$lib/$(basename "$f" | sed 's/\.so\..*/.so/')"
        done
        export LD_LIBRARY_PATH=$lib:$cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        PYTHONPATH=$PYTHONPATH:$PACK/py
    else
        [ -f "$PACK/src.tar.xz" ] || { echo "error: $PACK/src.tar.xz missing: run 'bash bench/gpu_check.sh pack' first" >&2; exit 2; }
        step "unpack; build the CUDA libraries and llama-bench for sm_$arch in the background ($cuda)"
        rm -rf "$w/src" && mkdir -p "$w/src" && tar xJf "$PACK/src.tar.xz" -C "$w/src"
        local sdist vendor gen=()
        sdist=$(echo "$w"/src/llama_cpp_python-*)
        vendor=$sdist/vendor/llama.cpp
        command -v ninja >/dev/null && gen=(-G Ninja)
        (cmake -S "$vendor" -B "$w/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
            -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DGGML_NATIVE=ON -DGGML_RPC=ON \
            -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
            -DLLAMA_INSTR_PATCH_HASH="$(cat "$PACK/patch_hash")" -DLLAMA_INSTR_LLAMA_COMMIT=0c1e570 \
            && cmake --build "$w/build" -j "$(nproc)" --target llama ggml ggml-rpc llama-bench) \
            >"$w/build.log" 2>&1 &
        build_pid=$!
        lib=$w/build/bin
        PYTHONPATH=$PYTHONPATH:$sdist
    fi
    export LLAMA_CPP_LIB_PATH=$lib
    local bench=$lib/llama-bench

    step "Python packages; the CUPTI tracer and the crash tracer; the models' F16 weights"
    # shellcheck disable=SC2086
    python3 -m pip install -q --no-index --no-deps --find-links "$PACK/whl" --target "$w/site" $WHEELS \
        >/dev/null 2>&1 || fail "pip install of the carried wheels"
    python3 -c "import numpy, pandas" || { echo "error: this Python lacks numpy or pandas" >&2; exit 2; }
    g++ -shared -fPIC -O2 -std=c++17 -I"$cuda/include" bench/cupti_trace.cpp \
        -L"$cuda/lib64" -L"$cuda/extras/CUPTI/lib64" -Wl,-rpath,"$cuda/lib64:$cuda/extras/CUPTI/lib64" -lcupti \
        -o "$w/cupti_trace.so" || fail "CUPTI tracer"
    gcc -shared -fPIC -O1 bench/segv_trace.c -o "$w/segv_trace.so" || fail "crash tracer"
    [ -f "$w/l1b-f16.gguf" ] || python3 bench/gpu_check.py model "$w/l1b-f16.gguf" >/dev/null || fail "model"
    [ -f "$w/moe.gguf" ] || python3 bench/gpu_check.py moe-model "$w/moe.gguf" >/dev/null || fail "MoE model"
    if [ -n "$build_pid" ]; then
        wait "$build_pid" || { tail -20 "$w/build.log"; echo "### the build failed" >&2; exit 1; }
        grep -o '\[[0-9]*/[0-9]*\]' "$w/build.log" | tail -1
    fi
    [ -f "$w/l1b.gguf" ] || python3 bench/gpu_check.py quantize "$w/l1b-f16.gguf" "$w/l1b.gguf" >/dev/null || fail "quantize"
    # instr, with a crash's native frames printed (and Python's)
    instr() { LD_PRELOAD=$w/segv_trace.so python3 -X faulthandler -m llamacpp_instr.cli "$@"; }
    instr doctor || fail "instr doctor"
    yes "The quick brown fox jumps over the lazy dog." | head -40 >"$w/prompt.txt"

    step "1. decode tokens/s with no session, MINIMAL, DETAILED (one process, alternated); text and logits"
    python3 bench/gpu_check.py --json "$out/levels.json" levels "$w/l1b.gguf" "$w/levels" -n 128 --rounds 5 \
        || fail "levels"
    step "1b. where the cost lands in a token: llama_decode, llama_synchronize, the logits"
    python3 bench/gpu_check.py --json "$out/phases.json" phases "$w/l1b.gguf" "$w/phases" -n 64 --rounds 5 \
        || fail "phases"

    step "2. the summary's tokens/s against llama-bench's (a run whose kernels were loaded by one before it, as llama-bench warms up)"
    python3 bench/gpu_check.py warm "$w/l1b.gguf" "$out/warm-minimal.log" --prompt-file "$w/prompt.txt" -n 128 \
        --level minimal || fail "warm run, MINIMAL"
    local p
    p=$(python3 -c "
from llamacpp_instr.converters import load_session
from llamacpp_instr.converters.reports.summary import overview
print(int(overview(load_session('$out/warm-minimal.log'))['prompt_tokens']))") || p=128
    "$bench" -m "$w/l1b.gguf" -ngl 99 -fa 0 -b 512 -ub 512 -r 3 -o json -p "$p" -n 0 >"$w/pp.json" \
        && "$bench" -m "$w/l1b.gguf" -ngl 99 -fa 0 -b 512 -ub 512 -r 3 -o json -p 0 -n 128 -d "$p" >"$w/tg.json" \
        && python3 -c "import json; print(json.dumps(json.load(open('$w/pp.json')) + json.load(open('$w/tg.json'))))" >"$out/bench.json" \
        && python3 bench/gpu_check.py --json "$out/headline.json" headline "$out/warm-minimal.log" "$out/bench.json" \
        || fail "headline against llama-bench"

    step "3. per-op GPU time against CUPTI's kernels of the same run (warm; ggml's programmatic launches on, then off)"
    CUPTI_TRACE_OUT=$out/kernels.txt LD_PRELOAD=$w/segv_trace.so:$w/cupti_trace.so python3 bench/gpu_check.py \
        warm "$w/l1b.gguf" "$out/cupti-detailed.log" --prompt-file "$w/prompt.txt" -n 32 \
        && python3 bench/cupti_join.py "$out/kernels.txt" "$out/cupti-detailed.log" | tee "$out/cupti.txt" \
        || fail "CUPTI join"
    GGML_CUDA_PDL=0 CUPTI_TRACE_OUT=$out/kernels-nopdl.txt LD_PRELOAD=$w/segv_trace.so:$w/cupti_trace.so \
        python3 bench/gpu_check.py warm "$w/l1b.gguf" "$out/cupti-detailed-nopdl.log" --prompt-file "$w/prompt.txt" -n 32 \
        && python3 bench/cupti_join.py "$out/kernels-nopdl.txt" "$out/cupti-detailed-nopdl.log" | tee "$out/cupti-nopdl.txt" \
        || fail "CUPTI join, no programmatic launches"

    step "4. the logs to commit: every layer offloaded, half of them, a MoE with its experts on the CPU"
    instr run "$w/l1b.gguf" --prompt-file "$w/prompt.txt" -n 16 --ignore-eos \
        -ngl all --no-flash-attn -o "$out/cuda-full-detailed.log" >/dev/null || fail "instr run -ngl all"
    instr run "$w/l1b.gguf" --prompt-file "$w/prompt.txt" -n 16 --ignore-eos --level minimal \
        -ngl all --no-flash-attn -o "$out/cuda-full-minimal.log" >/dev/null || fail "instr run -ngl all --level minimal"
    instr run "$w/l1b.gguf" --prompt-file "$w/prompt.txt" -n 16 --ignore-eos \
        -ngl 8 --no-flash-attn -o "$out/cuda-half-detailed.log" >/dev/null || fail "instr run -ngl 8"
    instr run "$w/moe.gguf" --prompt-file "$w/prompt.txt" -n 16 --ignore-eos \
        -ngl all --n-cpu-moe 4 --no-flash-attn -o "$out/cuda-moe-ncmoe4-detailed.log" >/dev/null \
        || fail "instr run --n-cpu-moe 4"
    for f in "$out"/cuda-*.log; do
        [ -f "$f" ] && instr summary "$f" | head -25
    done

    python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
figures = {p.stem: json.loads(p.read_text()) for p in (out / "levels.json", out / "phases.json", out / "headline.json") if p.is_file()}
for name in ("cupti", "cupti-nopdl"):
    if (out / f"{name}.txt").is_file():
        figures[name] = json.loads((out / f"{name}.txt").read_text().strip().splitlines()[-1])
(out / "gpu_check.json").write_text(json.dumps(figures, indent=1) + "\n")
lv, hd, cu = figures.get("levels", {}), figures.get("headline", {}), figures.get("cupti", {})
print("### figures")
print(f"MINIMAL {lv.get('minimal_ratio')}x (>= 0.99), DETAILED {lv.get('detailed_ratio')}x (>= 0.92) of no session")
print(f"text identical {lv.get('text_identical')}; logits bit-identical {lv.get('logits_bit_identical')}")
print(f"summary / llama-bench: prompt {hd.get('prompt_ratio')}, generation {hd.get('gen_ratio')} (0.90-1.10)")
print(f"op types within 10 % of CUPTI: {cu.get('op_types_within_10pct')}/{cu.get('op_types_total')}; "
      f"cover min {cu.get('coverage_min')} (>= 0.90)")
PY
    (cd "$out" && tar czf results.tgz --exclude=results.tgz --exclude=console.txt --exclude=gpu_check.json -- * \
        && find . -mindepth 1 -not -name results.tgz -not -name console.txt -not -name gpu_check.json -delete)
    step "done (figures in $out/gpu_check.json, logs and traces in $out/results.tgz)"
    return "$rc"
}

case "${1:-}" in
pack) pack "${2:-}" "${3:-}" ;;
run) run "${2:-}" ;;
*) sed -n 2,27p "$0"; exit 2 ;;
esac
