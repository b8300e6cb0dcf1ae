#!/usr/bin/env bash
# The CUDA op timer's checks on a GPU (docs/cuda.md; the figures: docs/performance.md, "CUDA"), in
# one go on a fresh machine with an NVIDIA GPU (H100, H200), its own CUDA toolkit and no network:
#
#   bash bench/gpu_check.sh pack        # here, with the network: .gpu-pack/ (53 MiB): the
#                                       # patched llama.cpp source and wheels of the Python
#                                       # packages a bare machine may lack
#   bash bench/gpu_check.sh pack --prebuilt BUILD
#                                       # instead of the source: the libraries and llama-bench of
#                                       # BUILD, a CMake build of the patched source with
#                                       # GGML_CUDA=ON made here, with the CUDA runtime it was
#                                       # built against
#   bash bench/gpu_check.sh run [OUT]   # there, from a copy of this working tree with .gpu-pack/
#                                       # (the device tool: carry=[".gpu-pack"]): OUT or $OUT
#   bash bench/gpu_check.sh run --dry-run [OUT]
#                                       # anywhere, no GPU: the same steps on the installed
#                                       # (CPU) build and a tiny model, the GPU-only parts
#                                       # (the build, CUPTI, llama-bench) left out: the plumbing
#
# `run` builds the patched libraries and llama-bench with ggml's CUDA backend as `instr build
# --cuda` builds the wheel (its CMake arguments, from `python3 -m llamacpp_instr.native.cuda_toolkit
# ARCH`: ggml's flash-attention kernels, its virtual-memory pool linked to the machine's driver)
# with GGML_NATIVE, for CUDA_ARCH (default 90), in the background, while it writes a random-weight
# model with Llama-3.2-1B's shapes (Q4_K_M once the build is done) and a small MoE. Then, in the
# order of their value, each step only when the time it is budgeted still fits in
# GPU_CHECK_BUDGET_S (540: the device tool's 10-minute command less a minute), every layer
# offloaded, at llama.cpp's defaults (CUDA graphs on, flash attention on) unless said:
#   smoke      one run of each setting (graphs on/off, GGML_CUDA_GRAPH_OPT=1, each with flash
#              attention on and off): a fault shows early
#   cost       decode tokens/s with no session, MINIMAL and DETAILED alternated in one process,
#              through the C API (MINIMAL >= 0.99x, DETAILED >= 0.95x) and llama-cpp-python's
#              Llama.eval (within 0.02 of the C API's ratio); text and logits against no session
#   cupti      DETAILED's op types against CUPTI's kernels, device copies and memsets of the same
#              run (within 10 %), each graph compute's cover (0.95-1.02), the copies against
#              CUPTI's memcpy records
#   graph-opt  GGML_CUDA_GRAPH_OPT=1: no op's interval spans a concurrent region; all streams' ops
#              against CUPTI's
#   headline   the summary's prompt and generation tokens/s of a MINIMAL run against llama-bench's
#              (within 10 %)
#   fixtures   the logs that replace tests/fixtures/*cuda* (OUT/<fixture name>.log.gz)
#   sampling   `host` and `chain` records against llama_perf_sampler (within 2 %)
#   moe        a MoE with --n-cpu-moe 4: its copies and GPU busy and idle time per step against
#              CUPTI's records
#   faults     the other runs of each setting, up to GPU_CHECK_ROUNDS (10) in all
# A step that fails (a fault among them: every Python run preloads bench/segv_trace.c and runs
# under faulthandler, so a crash prints its Python and native frames) is recorded and the next
# one runs; GPU_CHECK_FAULT=STEP makes that step die of a segmentation fault instead (the fault
# path's check). OUT gets gpu_check.json (each step's time and status, the figures, the targets
# met), console.txt, the four fixture logs and results.tgz (the other logs, CUPTI's traces, the
# build's log): at most eight files, as the device tool returns them. The exit status is 0 when
# every step that ran succeeded.
#
# A second command on the same machine (the device tool keeps it a while after a command) reuses
# the build, the models and the figures of the first: GPU_CHECK_ONLY="moe faults" runs only the
# steps named (those the first cut, say); the fault rounds go on from the last one run, and the
# summary covers both commands' figures.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PACK=$ROOT/.gpu-pack
# the project's and llama-cpp-python's dependencies beside numpy and pandas (pyproject.toml)
WHEELS="click orjson gguf rich markdown-it-py mdurl pygments isal prometheus-client typing-extensions
diskcache jinja2 markupsafe perfetto pyyaml"
# the fault runs' settings: name|environment|instr run's flash attention
SETTINGS=(
    "graphs-fa||--flash-attn"
    "graphs-nofa||--no-flash-attn"
    "nographs-fa|GGML_CUDA_DISABLE_GRAPHS=1|--flash-attn"
    "nographs-nofa|GGML_CUDA_DISABLE_GRAPHS=1|--no-flash-attn"
    "graphopt-fa|GGML_CUDA_GRAPH_OPT=1|--flash-attn"
    "graphopt-nofa|GGML_CUDA_GRAPH_OPT=1|--no-flash-attn"
)
FIXTURES="l1b-cuda-full-detailed l1b-cuda-full-minimal l1b-cuda-half-detailed moe-cuda-ncmoe4-detailed"

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
        # shellcheck disable=SC2086  # (split on purpose)
        python -m pip download -q --no-deps --only-binary=:all: --python-version "$v" \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform any -d "$PACK/whl" $WHEELS >/dev/null 2>&1
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

# ---- run: the steps and their bookkeeping ---------------------------------------------------

now() { echo $((SECONDS - t0)); }
say() { echo "### [$(now)s] $*"; }

# record NAME BUDGET_S SECONDS STATUS: one row of the steps' table (gpu_check.json's "steps")
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$w/steps.tsv"; }

# step NAME BUDGET_S FUNCTION: FUNCTION, when BUDGET_S seconds still fit before the deadline; its
# status recorded (a death by a signal named), and the next step runs whatever became of it
step() {
    local name=$1 need=$2 fn=$3 left rc s status=ok
    left=$((deadline - SECONDS))
    # (the build and the model every later step needs run always)
    if [ -n "${GPU_CHECK_ONLY:-}" ] && [[ " $GPU_CHECK_ONLY tracer build quantize " != *" $name "* ]]; then
        return 0
    fi
    if [ -n "$halt" ]; then
        say "skipped: $name ($halt)"
        record "$name" "$need" 0 "skipped: $halt"
        return 0
    fi
    if [ "$left" -lt "$need" ]; then
        say "cut: $name (budget ${need}s, ${left}s left)"
        record "$name" "$need" 0 cut
        return 0
    fi
    say "$name (budget ${need}s, ${left}s left)"
    s=$SECONDS
    if [ "${GPU_CHECK_FAULT:-}" = "$name" ]; then
        py bench/gpu_check.py crash
    else
        "$fn"
    fi
    rc=$?
    if [ "$rc" -eq "$DRY_SKIP" ]; then
        status=dry
    elif [ "$rc" -gt 128 ]; then
        status="FAILED: signal $((rc - 128))"
    elif [ "$rc" -ne 0 ]; then
        status="FAILED: exit $rc"
    fi
    case $status in FAILED*) echo "### FAILED: $name ($status)" >&2; failed=1 ;; esac
    record "$name" "$need" "$((SECONDS - s))" "$status"
    say "$name: $status in $((SECONDS - s))s"
    return 0
}

# Python with the crash tracer preloaded (and CUPTI's, where $CUPTI_TRACE_OUT is set) and
# faulthandler on: a crash prints Python's frames, then the faulting thread's native ones
py() {
    local pre=$w/segv_trace.so
    [ -n "${CUPTI_TRACE_OUT:-}" ] && pre=$pre:$w/cupti_trace.so
    LD_PRELOAD=$pre PYTHONUNBUFFERED=1 python3 -X faulthandler "$@"
}
instr() { py -m llamacpp_instr.cli "$@"; }
gpu() { py bench/gpu_check.py "$@"; }
# a step's part that needs the GPU: in the dry run, its status says so
gpu_only() { [ "$DRY" = 1 ] && { echo "(dry run: $*)"; return 0; }; return 1; }

# ---- run: the steps -------------------------------------------------------------------------

step_tracer() {
    # a deliberate fault: the frames must come out on this machine (its libc's backtrace)
    py bench/gpu_check.py crash 2>"$w/crash.txt"
    local rc=$?
    grep -c '^###   #' "$w/crash.txt" | sed 's/^/native frames printed: /'
    [ "$rc" -eq 139 ] && grep -q '### native crash: signal 11' "$w/crash.txt" && grep -q 'in cmd_crash' "$w/crash.txt"
}

step_build() {
    if [ -n "$build_pid" ]; then
        wait "$build_pid" || { tail -30 "$w/build.log"; return 1; }
        grep -o '\[[0-9]*/[0-9]*\]' "$w/build.log" | tail -1
        echo "$build_key" >"$w/build.ok"
    fi
    [ "$DRY" = 1 ] && return "$DRY_SKIP"
    return 0
}

# quiet FILE COMMAND...: COMMAND with its stderr in FILE (llama.cpp's chatter), shown when it fails
quiet() {
    local file=$1 rc
    shift
    "$@" 2>"$file"
    rc=$?
    [ "$rc" -eq 0 ] || tail -60 "$file" >&2
    return "$rc"
}

step_quantize() {
    [ -f "$w/model.gguf" ] && { echo "(the model of an earlier command here)"; return 0; }
    quiet "$w/quantize.err" gpu quantize "$w/model-f16.gguf" "$w/model.gguf" >/dev/null \
        && ls -la "$w/model.gguf"
}

# one run of a setting (round $1, setting $2): its output kept, its status in a .rc file
fault_run() {
    local r=$1 name env fa
    IFS='|' read -r name env fa <<<"$2"
    (
        [ -n "$env" ] && export "${env?}"
        instr run "$w/model.gguf" --prompt-file "$w/prompt.txt" -n 8 --ignore-eos -ngl all "$fa" \
            -o "$w/faults/$name-$r.log" >/dev/null 2>"$w/faults/$name-$r.err"
        echo $? >"$w/faults/$name-$r.rc"
    )
}

# rounds $1 to $2 of every setting, GPU_CHECK_JOBS at a time, a round begun only while the
# deadline allows one (about $3 s a round); a run that failed prints its output (the frames)
fault_rounds() {
    local first=$1 last=$2 per=$3 r s f bad=0 rc pids=()
    mkdir -p "$w/faults"
    for ((r = first; r <= last; r++)); do
        [ $((deadline - SECONDS)) -lt "$per" ] && { say "fault rounds from $r on: out of time"; break; }
        for s in "${SETTINGS[@]}"; do
            fault_run "$r" "$s" &
            pids+=($!)
            while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
        done
    done
    # (these runs only: a bare wait would wait for the console's tee too)
    [ "${#pids[@]}" -eq 0 ] || wait "${pids[@]}"
    for f in "$w"/faults/*.rc; do
        rc=$(cat "$f")
        [ "$rc" = 0 ] && continue
        bad=1
        echo "### fault run ${f%.rc} exited $rc:" >&2
        tail -60 "${f%.rc}.err" >&2
    done
    python3 - "$w/faults" "$w/json/faults.json" <<'PY'
import json, sys
from collections import defaultdict
from pathlib import Path
runs = defaultdict(lambda: [0, 0])
for f in Path(sys.argv[1]).glob("*.rc"):
    name = f.stem.rsplit("-", 1)[0]
    runs[name][0] += 1
    runs[name][1] += f.read_text().strip() != "0"
table = {k: {"runs": n, "failed": bad} for k, (n, bad) in sorted(runs.items())}
Path(sys.argv[2]).write_text(json.dumps(table, indent=1) + "\n")
print("runs per setting (failed):", ", ".join(f"{k} {v['runs']} ({v['failed']})" for k, v in table.items()))
PY
    return "$bad"
}

step_smoke() { fault_rounds 1 1 0; }
# the rounds after the last one run (by an earlier command on this machine, or smoke's)
step_faults() {
    local last
    last=$(find "$w/faults" -name '*.rc' 2>/dev/null | sed 's/.*-\([0-9]*\)\.rc$/\1/' | sort -n | tail -1)
    fault_rounds "$((${last:-1} + 1))" "$rounds" "$round_s"
}

step_cost() {
    # (the dry run: two short rounds, its plumbing only)
    local n=64 r=5
    [ "$DRY" = 1 ] && n=16 r=2
    gpu --json "$w/json/cost.json" cost "$w/model.gguf" "$w/cost" -n "$n" --rounds "$r" >/dev/null
}

step_cupti() {
    gpu_only "no CUPTI" && { gpu warm "$w/model.gguf" "$w/cupti-detailed.log" --prompt-file "$w/prompt.txt" -n 32 >/dev/null; return "$DRY_SKIP"; }
    CUPTI_TRACE_OUT=$w/kernels.txt gpu warm "$w/model.gguf" "$w/cupti-detailed.log" \
        --prompt-file "$w/prompt.txt" -n 32 >/dev/null \
        && python3 bench/cupti_join.py "$w/kernels.txt" "$w/cupti-detailed.log" | tee "$w/cupti.txt" \
        && tail -1 "$w/cupti.txt" >"$w/json/cupti.json" \
        && python3 bench/cupti_join.py "$w/kernels.txt" "$w/cupti-detailed.log" --copies >"$w/json/cupti-copies.json"
}

step_graph_opt() {
    export GGML_CUDA_GRAPH_OPT=1
    if gpu_only "no CUPTI"; then
        gpu warm "$w/model.gguf" "$w/graph-opt.log" --prompt-file "$w/prompt.txt" -n 32 >/dev/null \
            && gpu --json "$w/json/graph-opt-regions.json" regions "$w/graph-opt.log" --device CPU >/dev/null
        local rc=$?
        unset GGML_CUDA_GRAPH_OPT
        [ "$rc" -eq 0 ] && return "$DRY_SKIP"
        return "$rc"
    fi
    CUPTI_TRACE_OUT=$w/kernels-graph-opt.txt gpu warm "$w/model.gguf" "$w/graph-opt.log" \
        --prompt-file "$w/prompt.txt" -n 32 >/dev/null
    local rc=$?
    unset GGML_CUDA_GRAPH_OPT
    [ "$rc" -eq 0 ] \
        && gpu --json "$w/json/graph-opt-regions.json" regions "$w/graph-opt.log" \
        && python3 bench/cupti_join.py "$w/kernels-graph-opt.txt" "$w/graph-opt.log" --all-streams \
            | tee "$w/json/graph-opt-cupti.json"
}

step_headline() {
    gpu warm "$w/model.gguf" "$w/warm-minimal.log" --prompt-file "$w/prompt.txt" -n 128 \
        --level minimal >/dev/null || return 1
    [ -x "$bench" ] || { echo "(no llama-bench: $bench)"; return "$DRY_SKIP"; }
    local p
    p=$(python3 -c "
from llamacpp_instr.converters import load_session
from llamacpp_instr.converters.reports.summary import overview
print(int(overview(load_session('$w/warm-minimal.log'))['prompt_tokens']))") || return 1
    # llama.cpp's defaults (flash attention auto, graphs on), the warm run's batches; the prompt
    # from nothing, the generation after the prompt
    "$bench" -m "$w/model.gguf" -ngl 99 -b 512 -ub 512 -r 3 -o json -p "$p" -n 128 -d "0,$p" \
        >"$w/bench.json" 2>"$w/bench.err" \
        && gpu --json "$w/json/headline.json" headline "$w/warm-minimal.log" "$w/bench.json"
}

step_fixtures() {
    local f rc=0
    instr run "$w/model.gguf" --prompt-file "$w/prompt.txt" -n 16 --ignore-eos -ngl all \
        -o "$w/l1b-cuda-full-detailed.log" >/dev/null || rc=1
    instr run "$w/model.gguf" --prompt-file "$w/prompt.txt" -n 16 --ignore-eos -ngl all \
        --level minimal -o "$w/l1b-cuda-full-minimal.log" >/dev/null || rc=1
    instr run "$w/model.gguf" --prompt-file "$w/prompt.txt" -n 16 --ignore-eos -ngl 8 \
        -o "$w/l1b-cuda-half-detailed.log" >/dev/null || rc=1
    instr run "$w/moe.gguf" --prompt-file "$w/prompt.txt" -n 16 --ignore-eos -ngl all \
        --n-cpu-moe 4 -o "$w/moe-cuda-ncmoe4-detailed.log" >/dev/null || rc=1
    for f in $FIXTURES; do
        [ -f "$w/$f.log" ] && gzip -9c "$w/$f.log" >"$out/$f.log.gz"
    done
    return "$rc"
}

step_sampling() {
    gpu --json "$w/json/sampling.json" sampling "$w/model.gguf" "$w/sampling.log" -n 64 >/dev/null
}

step_moe() {
    gpu_only "no CUPTI" && {
        instr run "$w/moe.gguf" --prompt-file "$w/short.txt" -n 32 --ignore-eos -ngl all --n-cpu-moe 4 \
            -o "$w/moe-cupti.log" >/dev/null || return 1
        return "$DRY_SKIP"
    }
    CUPTI_TRACE_OUT=$w/kernels-moe.txt instr run "$w/moe.gguf" --prompt-file "$w/short.txt" -n 32 \
        --ignore-eos -ngl all --n-cpu-moe 4 -o "$w/moe-cupti.log" >/dev/null \
        && python3 bench/cupti_join.py "$w/kernels-moe.txt" "$w/moe-cupti.log" --copies | tee "$w/json/moe.json"
}

run() {
    DRY=0
    [ "${1:-}" = --dry-run ] && { DRY=1; shift; }
    out=${1:-${OUT:-$ROOT/gpu-check-out}}
    local arch=${CUDA_ARCH:-90}
    t0=$SECONDS
    deadline=$((t0 + ${GPU_CHECK_BUDGET_S:-540}))
    DRY_SKIP=77  # a step's status "dry": it needs the GPU
    failed=0
    halt=
    build_pid=
    w=/tmp/gpu-check
    # the models in memory where there is room (tmpfs writes the 2.9 GB F16 model fastest)
    [ "$DRY" = 0 ] && [ -d /dev/shm ] && [ "$(df -Pk /dev/shm | awk 'NR==2 {print $4}')" -gt 8000000 ] \
        && w=/dev/shm/gpu-check
    [ "$DRY" = 1 ] && w=$(mktemp -d)
    [ -n "${GPU_CHECK_WORK:-}" ] && w=$GPU_CHECK_WORK  # (the dry run's second command: the first's)
    rm -rf "$out" && mkdir -p "$out" "$w/json" || exit 2
    : >"$w/steps.tsv"
    exec > >(tee "$out/console.txt") 2>&1
    local tee_pid=$!
    rounds=${GPU_CHECK_ROUNDS:-$([ "$DRY" = 1 ] && echo 1 || echo 10)}
    jobs=${GPU_CHECK_JOBS:-$(nproc)}
    round_s=${GPU_CHECK_ROUND_S:-10}
    say "$([ "$DRY" = 1 ] && echo "dry run (no GPU): ")budget ${GPU_CHECK_BUDGET_S:-540}s, fault rounds $rounds, $jobs at a time"
    nvidia-smi -L 2>/dev/null || echo "(no nvidia-smi)"
    grep -m1 PRETTY_NAME /etc/os-release; ldd --version | head -1; python3 --version
    echo "debuggers: $(command -v gdb cuda-gdb | tr '\n' ' ')(the crash tracer needs none)"
    local cuda lib src_dir
    cuda=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")")
    export PYTHONPATH=$ROOT:$w/site
    build_key=$(cat "$PACK/patch_hash" 2>/dev/null)-$arch
    if [ "$DRY" = 1 ]; then
        say "dry run: the installed (CPU) build stands in for the CUDA one; no build, no CUPTI"
        lib=${LLAMA_CPP_LIB_PATH:-}
        bench=${LLAMA_BENCH:-none}
    elif [ -d "$PACK/lib" ]; then
        say "the libraries and llama-bench as carried (built elsewhere; $cuda for cuBLAS)"
        lib=$w/lib
        rm -rf "$lib" && mkdir -p "$lib"
        ln -s "$PACK"/lib/* "$lib/"
        for f in "$PACK"/lib/lib*.so.[0-9]*; do
            ln -sf "$(basename "$f")" "$lib/$(basename "$f" | sed 's/\.so\..*/.so/')"
        done
        export LD_LIBRARY_PATH=$lib:$cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        PYTHONPATH=$PYTHONPATH:$PACK/py
        bench=$lib/llama-bench
    elif [ -f "$w/build.ok" ] && [ "$(cat "$w/build.ok")" = "$build_key" ]; then
        say "the build of an earlier command here (sm_$arch, patch hash $(cat "$PACK/patch_hash"))"
        lib=$w/build/bin
        PYTHONPATH=$PYTHONPATH:$(echo "$w"/src/llama_cpp_python-*)
        bench=$lib/llama-bench
    else
        [ -f "$PACK/src.tar.xz" ] || { echo "error: $PACK/src.tar.xz missing: run 'bash bench/gpu_check.sh pack' first" >&2; exit 2; }
        say "unpack; build the CUDA libraries and llama-bench for sm_$arch in the background ($cuda)"
        rm -f "$w/build.ok"
        rm -rf "$w/src" && mkdir -p "$w/src" && tar xJf "$PACK/src.tar.xz" -C "$w/src"
        local vendor gen=() args=()
        src_dir=$(echo "$w"/src/llama_cpp_python-*)
        vendor=$src_dir/vendor/llama.cpp
        command -v ninja >/dev/null && gen=(-G Ninja)
        # instr build --cuda's arguments (ggml's defaults: flash-attention kernels; the VMM pool
        # linked to this machine's driver), then GGML_NATIVE and llama-bench's own
        mapfile -t args < <(python3 -m llamacpp_instr.native.cuda_toolkit "$arch")
        [ "${#args[@]}" -gt 0 ] || { echo "error: no CMake arguments for CUDA here" >&2; exit 2; }
        printf '  %s\n' "${args[@]}"
        (cmake -S "$vendor" -B "$w/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
            "${args[@]}" -DGGML_NATIVE=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON \
            -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
            -DLLAMA_OPENSSL=OFF -DLLAMA_INSTR_PATCH_HASH="$(cat "$PACK/patch_hash")" \
            -DLLAMA_INSTR_LLAMA_COMMIT=0c1e570 \
            && cmake --build "$w/build" -j "$(nproc)" --target llama ggml ggml-rpc llama-bench) \
            >"$w/build.log" 2>&1 &
        build_pid=$!
        lib=$w/build/bin
        PYTHONPATH=$PYTHONPATH:$src_dir
        bench=$lib/llama-bench
    fi
    [ -n "$lib" ] && export LLAMA_CPP_LIB_PATH=$lib

    say "Python packages, the crash tracer, CUPTI's tracer, the models' weights (beside the build)"
    if [ "$DRY" = 0 ] && [ ! -d "$w/site/orjson" ]; then
        # shellcheck disable=SC2086
        python3 -m pip install -q --no-index --no-deps --find-links "$PACK/whl" --target "$w/site" $WHEELS \
            >/dev/null 2>&1 || echo "### pip install of the carried wheels failed" >&2
    fi
    python3 -c "import numpy, pandas" || { echo "error: this Python lacks numpy or pandas" >&2; exit 2; }
    gcc -shared -fPIC -O1 bench/segv_trace.c -o "$w/segv_trace.so" || { echo "error: crash tracer" >&2; exit 2; }
    if [ "$DRY" = 0 ]; then
        g++ -shared -fPIC -O2 -std=c++17 -I"$cuda/include" -I"$cuda/extras/CUPTI/include" bench/cupti_trace.cpp \
            -L"$cuda/lib64" -L"$cuda/extras/CUPTI/lib64" -Wl,-rpath,"$cuda/lib64:$cuda/extras/CUPTI/lib64" \
            -lcupti -o "$w/cupti_trace.so" || echo "### the CUPTI tracer did not build" >&2
    fi
    # (a prompt of about 400 tokens; the dry run's 4 lines keep its CPU runs short)
    yes "The quick brown fox jumps over the lazy dog." | head "-$([ "$DRY" = 1 ] && echo 4 || echo 40)" \
        >"$w/prompt.txt"
    echo "The quick brown fox" >"$w/short.txt"
    step tracer 5 step_tracer
    if [ -f "$w/model.gguf" ] || [ -f "$w/model-f16.gguf" ]; then
        :  # (an earlier command's)
    elif [ "$DRY" = 1 ]; then
        gpu tiny-model "$w/model-f16.gguf" >/dev/null || echo "### model" >&2
    else
        gpu model "$w/model-f16.gguf" >/dev/null || echo "### model" >&2
    fi
    [ -f "$w/moe.gguf" ] || gpu moe-model "$w/moe.gguf" >/dev/null || echo "### MoE model" >&2
    say "the models are written"

    step build 0 step_build
    grep -q $'^build\t.*\tFAILED' "$w/steps.tsv" && halt="the build failed"
    step quantize 30 step_quantize
    grep -q $'^quantize\t.*\tFAILED' "$w/steps.tsv" && halt="no model"
    step smoke 20 step_smoke
    step cost 50 step_cost
    step cupti 25 step_cupti
    step graph-opt 25 step_graph_opt
    step headline 30 step_headline
    step fixtures 30 step_fixtures
    step sampling 15 step_sampling
    step moe 20 step_moe
    step faults "$round_s" step_faults

    local dry=()
    [ "$DRY" = 1 ] && dry=(--dry-run)
    python3 bench/gpu_verdict.py "$w/json" "$w/steps.tsv" "$out/gpu_check.json" \
        --budget "${GPU_CHECK_BUDGET_S:-540}" --seconds "$(now)" "${dry[@]}" || failed=1
    # the rest, for a closer look: the runs' logs and outputs, CUPTI's traces, the build's log
    (cd "$w" && find . -maxdepth 2 \( -name '*.log' -o -name '*.txt' -o -name '*.tsv' -o -name '*.json' -o -name '*.err' \
        -o -name '*.rc' \) -not -path './faults/*.log' -not -path './src/*' -print0 \
        | tar czf "$out/results.tgz" --null -T -)
    [ "$DRY" = 1 ] && [ -z "${GPU_CHECK_WORK:-}" ] && rm -rf "$w"
    say "done: $out (gpu_check.json, console.txt, the fixture logs, results.tgz)"
    exec >/dev/null 2>&1
    wait "$tee_pid"  # console.txt complete before the command returns
    return "$failed"
}

case "${1:-}" in
pack) pack "${2:-}" "${3:-}" ;;
run) shift; run "$@" ;;
*) sed -n 2,44p "$0"; exit 2 ;;
esac
