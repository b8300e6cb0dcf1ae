"""Native units built alone against the patched tree (the pin extracted and patched as `instr
build` does), where the library's own entry points cannot reach the case: tests/native/*.cpp, each
a program that exits 0 when the unit holds."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.native

HERE = Path(__file__).resolve().parent


def build_unit(
    vendor: Path, name: str, includes: list[str], libs: list[str], tmp_path: Path
) -> Path:
    """tests/native/<name>.cpp built against the patched tree's include folders, linked to the
    named libraries of the build the tests run on."""
    from helpers.rpc_backend import lib_dir

    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path / name
    lib = lib_dir()
    cmd = [
        cxx,
        "-std=c++17",
        "-O1",
        "-g",
        *[f"-I{vendor / d}" for d in includes],
        str(HERE / "native" / f"{name}.cpp"),
        *[str(lib / f"{n}.so") for n in libs],
        f"-Wl,-rpath,{lib}",
        "-o",
        str(exe),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return exe


# the include folders and libraries of a unit of libllama's own code (the graph index)
LLAMA_INCLUDES = ["src", "include", "ggml/include"]
LLAMA_LIBS = ["libllama", "libggml-base"]


def run_unit(
    vendor: Path, name: str, includes: list[str], libs: list[str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """tests/native/<name>.cpp built (build_unit) and run: its exit status and output."""
    exe = build_unit(vendor, name, includes, libs, tmp_path)
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)


def test_rows_out_of_memory_never_end_the_program(vendor: Path, tmp_path: Path) -> None:
    """json_rows with every allocation from the n-th on failing (issue 55 §1): each failure reaches
    the caller as std::bad_alloc. Before the fix its destructor appended what it held, so the
    second failure, while the first unwound, ended the program (std::terminate) past every catch
    in the hooks."""
    r = run_unit(vendor, "json_rows_oom", ["src", "ggml/include"], ["libggml-base"], tmp_path)
    assert r.returncode == 0, f"died ({r.returncode}): {r.stderr[-2000:]}"
    assert "each caught" in r.stdout and int(r.stdout.split()[0]) > 2, r.stdout


def test_the_statistics_simd_lanes_make_what_one_value_at_a_time_made(
    vendor: Path, tmp_path: Path
) -> None:
    """VERBOSE's value statistics summed with SIMD registers (SSE2, and AVX where the CPU has it)
    are bit for bit what the lanes made one value at a time: each lanes function against the
    scalar one, and accumulate against the code before them, over runs of every length, signed
    zeros, subnormals, large values and blocks with a NaN or an infinity."""
    r = run_unit(vendor, "stats_lanes", LLAMA_INCLUDES, LLAMA_LIBS, tmp_path)
    assert r.returncode == 0, f"died ({r.returncode}): {r.stderr[-2000:]}"
    n, lanes = r.stdout.split()[0], r.stdout.split()[2]
    assert int(n) > 100 and int(lanes) >= 1, r.stdout


def test_each_value_statistic_reads_back_as_the_float_it_was(vendor: Path, tmp_path: Path) -> None:
    """put_f32, the text of each value statistic: every float at a stride over the bit patterns,
    both signs, and around every power of two reads back (strtof) as itself, in at most 16
    characters of a JSON number."""
    r = run_unit(vendor, "put_f32", ["src", "ggml/include"], ["libggml-base"], tmp_path)
    assert r.returncode == 0, f"died ({r.returncode}): {r.stdout[-500:]} {r.stderr[-2000:]}"
    assert int(r.stdout.split()[0]) > 1_000_000, r.stdout


def test_a_kept_graph_is_not_a_graph_with_other_sources(vendor: Path, tmp_path: Path) -> None:
    """A graph built again in the same memory, same nodes, ops and shapes, but reading another
    source (a control vector's or an adapter's, a copy of a new scheduler's) is not the graph kept
    (issue 55 §1): graph_index::same_as tells them apart, and a graph built again the same is
    still found, its sources read again. Before the fix the fingerprint left the sources out, so a
    kept index whose sources were freed was taken for the new graph, and capture() followed them.
    Linked to the build's libllama, which exports the index."""
    r = run_unit(vendor, "kept_graph", LLAMA_INCLUDES, LLAMA_LIBS, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_an_encoders_blocks_are_the_run_clip_names_from_zero(vendor: Path, tmp_path: Path) -> None:
    """encoder_layers over the layer sequences clip's graphs name: a ViT's, lfm2a's conformer (a
    pre-encoder numbering its convolutions 0-6: the input's, not blocks), whisper with glma's
    projector (a feed-forward built with layer 0 after the blocks: the projector's, not block 0),
    minicpmv's merger between two ranges of blocks, gemma3nv's (none named)."""
    r = run_unit(vendor, "encoder_layers", LLAMA_INCLUDES, LLAMA_LIBS, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_a_failed_index_build_leaves_no_index(vendor: Path, tmp_path: Path) -> None:
    """graph_index::build with every allocation from the n-th on failing, rebuilding a graph that
    was indexed whole (issue 55 §1): no failure leaves an index that same_as takes for the graph,
    so the next compute indexes it again instead of using half-filled tables. Before the fix
    build() set the graph, its node count and fingerprint first, and a failed build matched."""
    r = run_unit(vendor, "index_build_oom", LLAMA_INCLUDES, LLAMA_LIBS, tmp_path)
    assert r.returncode == 0, f"died ({r.returncode}): {r.stderr[-2000:]}"
    assert "none left an index" in r.stdout and int(r.stdout.split()[0]) >= 3, r.stdout


_STRONG = {
    "release": {"release", "acq_rel", "seq_cst"},
    "acquire": {"acquire", "acq_rel", "seq_cst"},
}


def _atomics(ir: str, function: str) -> list[tuple[str, str, str]]:
    """(operation, variable, memory order) of each atomic access in ``function``'s LLVM IR, in
    order: the level is "level", its change count "changes"."""
    body = ir.split(f"@{function}(", 1)[1].split("\n}", 1)[0]
    out = []
    for line in body.splitlines():
        m = re.search(r"(atomicrmw \w+|load atomic|store atomic|cmpxchg)", line)
        if not m:
            continue
        var = "changes" if "@g_llama_instr_level_changes" in line else "level"
        order = re.findall(r"\b(monotonic|acquire|release|acq_rel|seq_cst)\b", line)[0]
        out.append((m.group(1), var, order))
    return out


def test_a_thread_that_sees_the_level_sees_its_change_counted(vendor: Path) -> None:
    """The level and the count of its changes (issue 55 §1): compute_begin skips checking a reused
    graph when the count is the one it saw at the last compute, so a thread that sees the hooks on
    again must see the changes that turned them off and on. The setter raises the count and then
    stores the level with release; the reader loads the level with acquire, then the count. On
    x86 every order compiles to the same instructions, so no run here can show a stale count:
    this reads the orders clang gives the two functions (LLVM IR, which a weakly ordered CPU's
    code generator honours). Before the fix the level was stored relaxed ("monotonic") and the
    reader loaded only the count, relaxed: both asserts below failed."""
    clang = shutil.which("clang++")
    if clang is None:
        pytest.skip("no clang++")
    cmd = [
        clang,
        "-std=c++17",
        "-O2",
        "-S",
        "-emit-llvm",
        "-o",
        "-",
        *[f"-I{vendor / d}" for d in LLAMA_INCLUDES],
        str(HERE / "native" / "level_order.cpp"),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    writer = _atomics(r.stdout, "level_writer")
    assert [(op, var) for op, var, _ in writer] == [
        ("atomicrmw add", "changes"),
        ("atomicrmw xchg", "level"),
    ]
    assert writer[1][2] in _STRONG["release"], writer
    reader = _atomics(r.stdout, "level_reader")
    assert [(op, var) for op, var, _ in reader] == [
        ("load atomic", "level"),
        ("load atomic", "changes"),
    ]
    assert reader[0][2] in _STRONG["acquire"], reader


def test_a_dropped_stream_out_of_memory_never_ends_the_server(vendor: Path, tmp_path: Path) -> None:
    """llama-server's request_handle released (a stream the client dropped) while allocations fail,
    from the n-th on for n = 1, 2, ...: its destructor, which builds and writes the request's
    record, never lets an exception out (std::terminate would end the server), and the record it
    could not make is counted lost. Before the fix the first failure, std::bad_alloc from the
    record's text, ended the program (SIGABRT)."""
    exe = build_unit(
        vendor,
        "request_handle_oom",
        ["tools", "include", "ggml/include"],
        ["libllama", "libggml-base"],
        tmp_path,
    )
    r = subprocess.run(
        [str(exe), str(tmp_path / "requests.log")], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, f"died ({r.returncode}): {r.stderr[-2000:]}"
    assert "each survived" in r.stdout and int(r.stdout.split()[0]) >= 3, r.stdout


def test_the_budget_holds_no_bytes_of_a_failed_allocation_and_never_wraps(
    vendor: Path, tmp_path: Path
) -> None:
    """A budget of 1 MiB on the CPU: an allocation the budget passed whose backend then threw
    leaves no bytes held (a buffer of 800 KiB fits afterwards), and a size whose sum with the bytes
    in use wraps past SIZE_MAX is refused by the budget. Before the fix the thrown allocation's
    bytes stayed pending for good (the next buffer was refused), and the wrapped sum passed."""
    r = run_unit(
        vendor,
        "budget_release",
        ["ggml/src", "ggml/include", "include"],
        ["libllama", "libggml", "libggml-base"],
        tmp_path,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_gpu_marks_become_ops_layer_spans_busy_stretches_and_copies(
    vendor: Path, tmp_path: Path
) -> None:
    """The walk of a GPU's timing marks (the CUDA op timer's host side), with marks made up in the
    shapes patch 0013 writes, since no GPU runs here: each op's interval runs to the next mark on
    its stream (a side stream's last op to its join), a graph compute's first mark to its end mark
    is a busy stretch, a copy's marks bound it; at MINIMAL the runs between a layer's first marks
    are its spans; a mark that never ran, a stream out of range, a foreign node, a time going
    back and an op never ended are each one op lost. With GGML_CUDA_GRAPH_OPT's concurrent
    regions, the op before the fork ends at its FORK mark (no op outside the region overlaps it)
    and a layer's span runs through it. The room the timer holds for a step's marks grows at most
    once for a decode of the batch's ubatches, never at its later computes. Linked to the build's
    libllama."""
    r = run_unit(vendor, "gpu_marks", LLAMA_INCLUDES, LLAMA_LIBS, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_a_rotation_under_faults_at_each_step_loses_no_file(vendor: Path, tmp_path: Path) -> None:
    """log_file::reopen rotating a full series (keep=3) with each of its steps in turn (link,
    rename, unlink) failing once, or failing with every later step into the same name, or with a
    second name failing in the roll back, or the process dying there (a forked child), and with
    each allocation in reopen in turn throwing std::bad_alloc (tests/native/rotate_faults.cpp): a
    rotation that cannot finish leaves every file where it was with its content, however often it
    is tried, with one warning; the next one without the fault rotates the series whole; one
    descriptor stays open, at the file at the log's name. Linked to the build's libllama."""
    exe = build_unit(vendor, "rotate_faults", LLAMA_INCLUDES, LLAMA_LIBS, tmp_path)
    folder = tmp_path / "series"
    folder.mkdir()
    r = subprocess.run([str(exe), str(folder)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"died ({r.returncode}): {r.stderr[-3000:]}"
    steps, fails, crashes, allocs = (int(x) for x in r.stdout.split())
    # 14 steps for keep=3: every case ran at each of them
    assert steps >= 10 and fails == 2 * steps + 1 and crashes == steps and allocs > 3 * 3, r.stdout


def test_the_host_hooks_survive_failed_allocations(vendor: Path, tmp_path: Path) -> None:
    """llama-server's hooks of the host's work with every allocation from the n-th on failing:
    host_sent (inside cpp-httplib's content provider, where an exception reaches no catch) and
    host_released (at a slot's release) let nothing out, each failure counted as a lost record,
    and each hook is noexcept (without its catch, the first failure reaches the caller as
    std::bad_alloc)."""
    exe = build_unit(
        vendor,
        "host_hooks_oom",
        ["tools", "include", "ggml/include"],
        ["libllama", "libggml-base"],
        tmp_path,
    )
    r = subprocess.run(
        [str(exe), str(tmp_path / "host.log")], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, f"died ({r.returncode}): {r.stderr[-2000:]}"
    assert "each survived" in r.stdout and int(r.stdout.split()[0]) >= 2, r.stdout


def test_a_streams_chunks_count_for_its_request_alone(vendor: Path, tmp_path: Path) -> None:
    """A stream's content provider calls on one HTTP thread, each a send_scope: a chunk counts for
    the request whose stream wrote it, none for a later call whose stream names no request, and
    nothing holds the request once its stream has ended."""
    exe = build_unit(
        vendor, "host_streams", ["tools", "include", "ggml/include"], ["libllama"], tmp_path
    )
    r = subprocess.run(
        [str(exe), str(tmp_path / "streams.log")], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, f"died ({r.returncode}): {r.stderr[-2000:]}"
    assert "each chunk counted once" in r.stdout, r.stdout


def test_the_stream_provider_forgets_its_chunks_request_when_each_call_returns(
    vendor: Path,
) -> None:
    """The patched server's content provider of a stream opens a send_scope before its
    response's next() names the chunk's request, so that the request is forgotten when the call
    returns, whether it wrote a chunk or not (host_hooks.cpp checks what the scope does)."""
    src = (vendor / "tools" / "server" / "server-http.cpp").read_text()
    provider = src[src.index("chunked_content_provider = ") :]
    provider = provider[: provider.index("\n        };")]
    assert "llama_instr_tools::send_scope" in provider, provider
    assert provider.index("llama_instr_tools::send_scope") < provider.index("response->next(chunk)")


def test_the_pin_compiles_flash_attention_kernels_by_default(vendor: Path) -> None:
    """The pin's ggml-cuda options: its flash-attention kernels on (for llama.cpp's default K/V
    types; all quantized pairs off), the virtual-memory pool on: what a build that names neither
    compiles."""
    text = (vendor / "ggml" / "CMakeLists.txt").read_text()

    def default(name: str) -> str:
        line = next(ln for ln in text.splitlines() if ln.startswith(f"option({name} "))
        return line.split()[-1].rstrip(")")

    assert default("GGML_CUDA_FA") == "ON"
    assert default("GGML_CUDA_FA_ALL_QUANTS") == "OFF"
    assert default("GGML_CUDA_NO_VMM") == "OFF"


def test_the_cuda_timer_arms_for_a_compute_with_no_context(vendor: Path, tmp_path: Path) -> None:
    """The CUDA op timer's arm on profiler entry points made in the unit (no device): armed for
    an encoder's compute, which has no llama_context (mtmd's clip graph on the first GPU), it
    holds room for one compute of the graph and hands the backend its profiler, every op
    selected at DETAILED and the layers' first ops at MINIMAL (tests/native/cuda_arm.cpp). Linked
    to the build's libllama."""
    r = run_unit(vendor, "cuda_arm", LLAMA_INCLUDES, LLAMA_LIBS, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", f"{r.returncode}: {r.stderr[-2000:]}"
