"""What an encode takes from the thread that runs it and leaves to it, through mtmd's C API as its
callers use it (a tiny gemma3 projector on the tiny llama, the testing build's libraries):

- with mtmd's warm-up off (``mtmd_context_params.warmup``, llama-server's --no-warmup), the first
  encode reserves the compute buffers itself, building the warm-up's graphs inside the encode:
  its graph's nodes are in the same layers as with the warm-up (its input's in none, before the
  blocks; not the projector's), and the compute buffers it reserves name the encoder's context and the
  encode's step, as a decode's compute buffer grown in a step names its context and step;
- a text chunk given to ``mtmd_encode_chunk`` (which mtmd answers with 0 and nothing encoded) is
  no encode: no step is written;
- ``llama_instr_encoder_buffers(encoder, 0)`` gives back what the thread's buffers were for
  before the matching 1 or 2: calls nest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.mmproj_gguf import write_vision_mmproj
from helpers.mtmd_input import ON_PATH
from helpers.support import by_type, read_log, run_on_lib

pytestmark = pytest.mark.native

# a session at detailed around mtmd_init_from_file (warm-up as told) and the chunks of
# "look: <image>": the text chunk given to mtmd_encode_chunk too where told, then each image chunk
ENCODE = ON_PATH + r"""
import json, sys
from pathlib import Path
import llama_cpp.mtmd_cpp as mtmd
from helpers import mtmd_input
import llamacpp_instr
from llamacpp_instr.running import runner

model, mmproj, log, warmup, text_too = sys.argv[1:]
llm = runner.load_model(runner.RunConfig(model=Path(model), prompt="", n_ctx=256))
codes = []
with llamacpp_instr.session(llm, log, level="detailed"):
    params = mtmd.mtmd_context_params_default()
    params.n_threads = 1
    params.print_timings = False
    params.warmup = warmup == "1"
    ctx = mtmd.mtmd_init_from_file(mmproj.encode(), llm.model, params)
    assert ctx
    bmp = mtmd_input.medium(mtmd, ctx, 64, 48)
    chunks = mtmd_input.look_chunks(mtmd, ctx, bmp)
    for i in range(mtmd.mtmd_input_chunks_size(chunks)):
        chunk = mtmd.mtmd_input_chunks_get(chunks, i)
        is_text = mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT
        if not is_text or text_too == "1":
            codes.append([is_text, mtmd.mtmd_encode_chunk(ctx, chunk)])
    mtmd.mtmd_input_chunks_free(chunks)
    mtmd.mtmd_bitmap_free(bmp)
    mtmd.mtmd_free(ctx)
llm.close()
print(json.dumps(codes))
"""


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A gemma3 projector for the tiny llama (256 wide): one encode per image."""
    folder = tmp_path_factory.mktemp("mmproj")
    return write_vision_mmproj(folder / "gemma3.gguf", projector="gemma3", n_embd_text=256)


def encode(
    lib: Path, model: Path, mmproj: Path, log: Path, warmup: bool, text_too: bool = False
) -> tuple[list[Any], list[dict[str, Any]]]:
    """ENCODE on the libraries in ``lib``: mtmd's return codes ([is text, code] per chunk given)
    and the log's records."""
    r = subprocess.run(
        [sys.executable, "-c", ENCODE, str(model), str(mmproj), str(log)]
        + ["1" if warmup else "0", "1" if text_too else "0"],
        env=dict(os.environ, LLAMA_CPP_LIB_PATH=str(lib), MTMD_CPP_LIB=str(lib)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), read_log(log)


def encoder_of(recs: list[dict[str, Any]]) -> dict[str, Any]:
    [ctx] = [c for c in by_type(recs, "context") if c.get("role") == "encoder"]
    return ctx


def first_encode_graph(recs: list[dict[str, Any]]) -> list[tuple[str, int | None]]:
    """The (op, layer) of each node of the encoder's first graph (layer None: no layer's)."""
    ctx = encoder_of(recs)["ctx"]
    graph = next(g for g in by_type(recs, "graph") if g["ctx"] == ctx)
    return [(n["op"], n["layer"]) for n in graph["nodes"]]


def test_without_warmup_the_first_encode_labels_its_nodes_as_with_it(
    testing_lib: Path, tiny_llama_f32: Path, gemma3: Path, tmp_path: Path
) -> None:
    """The warm-up's graphs, built inside the first encode when mtmd's warm-up is off, leave no
    layer behind: the encode's graph is in the same layers as with the warm-up (its input's
    nodes in none, before the first block; none of them the projector's)."""
    codes, warm = encode(testing_lib, tiny_llama_f32, gemma3, tmp_path / "warm.log", True)
    assert codes == [[False, 0]]
    codes, cold = encode(testing_lib, tiny_llama_f32, gemma3, tmp_path / "cold.log", False)
    assert codes == [[False, 0]]
    n_layer = encoder_of(warm)["model"]["n_layer"]
    layers = first_encode_graph(warm)
    assert layers[0] == ("IM2COL", None), layers  # the patch embedding: no layer's
    assert {None, n_layer, *range(n_layer)} == {layer for _, layer in layers}, layers
    assert first_encode_graph(cold) == layers


def test_compute_buffers_reserved_in_an_encode_name_its_context_and_step(
    testing_lib: Path, tiny_llama_f32: Path, gemma3: Path, tmp_path: Path
) -> None:
    """Without mtmd's warm-up the first encode reserves the encoder's compute buffers: each
    `memory_alloc` of them names the encoder's context and the encode's step."""
    _, recs = encode(testing_lib, tiny_llama_f32, gemma3, tmp_path / "cold.log", False)
    enc = encoder_of(recs)["ctx"]
    [begin] = [b for b in by_type(recs, "step_begin") if b["ctx"] == enc]
    [end] = [e for e in by_type(recs, "step_end") if e["ctx"] == enc]
    made = [
        r
        for r in by_type(recs, "memory_alloc")
        if r["purpose"] == "encoder_compute" and begin["ts"] <= r["ts"] <= end["ts"]
    ]
    assert made and any(r["bytes"] > 0 for r in made), made
    assert {(r.get("ctx"), r.get("step")) for r in made} == {(enc, begin["step"])}, made


def test_a_text_chunk_given_to_encode_is_no_encode(
    testing_lib: Path, tiny_llama_f32: Path, gemma3: Path, tmp_path: Path
) -> None:
    """mtmd answers a text chunk with 0 and encodes nothing: the log has the image's encode
    alone."""
    codes, recs = encode(testing_lib, tiny_llama_f32, gemma3, tmp_path / "t.log", True, True)
    assert [c for _, c in codes] == [0] * len(codes) and [t for t, _ in codes].count(False) == 1
    assert len(codes) > 1, codes  # the text before the image (gemma3's wraps it in text too)
    [medium] = by_type(recs, "media")
    encodes = [b for b in by_type(recs, "step_begin") if b["kind"] == "encode"]
    assert [b["media"] for b in encodes] == [[[medium["id"], 0]]], encodes
    assert len(by_type(recs, "step_end")) == len(by_type(recs, "step_begin"))


# the buffers a thread allocates under nested calls of llama_instr_encoder_buffers, in a session:
# the CPU's buffer type's, 64 bytes more each time to tell them apart
NESTING = r"""
import ctypes, json, sys
from llamacpp_instr.native import bindings

log = sys.argv[1]
api = bindings.load()
lib = api.lib
lib.llama_instr_encoder_buffers.argtypes = [ctypes.c_void_p, ctypes.c_int32]
lib.llama_instr_encoder_buffers.restype = None
lib.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
lib.ggml_backend_buft_alloc_buffer.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
lib.ggml_backend_buft_alloc_buffer.restype = ctypes.c_void_p
lib.ggml_backend_buffer_free.argtypes = [ctypes.c_void_p]
cpu = lib.ggml_backend_cpu_buffer_type()
a = ctypes.addressof(ctypes.create_string_buffer(8))
b = ctypes.addressof(ctypes.create_string_buffer(8))
made = []

def alloc():
    made.append(lib.ggml_backend_buft_alloc_buffer(cpu, 4096 + 64 * len(made)))

api.session_begin(None, log, "detailed", {})
alloc()                                 # nothing of an encoder
lib.llama_instr_encoder_buffers(a, 1)
alloc()                                 # a's weights
lib.llama_instr_encoder_buffers(b, 2)
alloc()                                 # b's compute, inside a's weights
lib.llama_instr_encoder_buffers(b, 0)
alloc()                                 # a's weights again
lib.llama_instr_encoder_buffers(a, 0)
alloc()                                 # nothing of an encoder
lib.llama_instr_encoder_buffers(a, 0)   # one more than were opened: nothing of an encoder
alloc()
for buf in made:
    lib.ggml_backend_buffer_free(buf)
api.session_end("ok")
print(json.dumps(len(made)))
"""


def test_encoder_buffers_restore_the_purpose_before_them(testing_lib: Path, tmp_path: Path) -> None:
    log = tmp_path / "nest.log"
    assert run_on_lib(NESTING, testing_lib, log) == 6
    sizes = {4096 + 64 * i for i in range(6)}
    made = [r for r in by_type(read_log(log), "memory_alloc") if r["bytes"] in sizes]
    assert [r["bytes"] for r in made] == sorted(sizes)
    assert [r["purpose"] for r in made] == [
        "other",
        "encoder_weights",
        "encoder_compute",
        "encoder_weights",
        "other",
        "other",
    ]


@pytest.mark.parametrize("warmup", [True, False])
def test_instr_run_gives_mtmd_its_warmup(
    testing_lib: Path,
    tiny_llama_f32: Path,
    gemma3: Path,
    media: dict[str, Path],
    tmp_path: Path,
    warmup: bool,
) -> None:
    """instr run --no-warmup turns mtmd's warm-up off too, as llama-server's and llama-mtmd-cli's
    --no-warmup do: the encoder's compute buffers are reserved by its first encode, whose step
    they name, where with the warm-up they are reserved when the projector loads (before the
    session: at its start, naming no step)."""
    log = tmp_path / "run.log"
    r = subprocess.run(
        [sys.executable, "-m", "llamacpp_instr.cli", "run", str(tiny_llama_f32)]
        + ["--mmproj", str(gemma3), "--image", str(media["test-1.jpeg"]), "-p", "hi", "-n", "1"]
        + ["--ctx", "512", "-o", str(log), "--warmup" if warmup else "--no-warmup"],
        env=dict(os.environ, LLAMA_CPP_LIB_PATH=str(testing_lib), MTMD_CPP_LIB=str(testing_lib)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    recs = read_log(log)
    enc = encoder_of(recs)["ctx"]
    first = min(b["step"] for b in by_type(recs, "step_begin") if b["ctx"] == enc)
    compute = [r for r in by_type(recs, "memory_alloc") if r["purpose"] == "encoder_compute"]
    assert compute and any(r["bytes"] > 0 for r in compute), compute
    named = {(r.get("ctx"), r.get("step")) for r in compute}
    assert named == ({(None, None)} if warmup else {(enc, first)}), compute
