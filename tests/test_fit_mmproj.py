"""instr fit --mmproj: a projector's weights and compute buffers counted on the device its encoder
runs on. With and without it, fit's footprints differ by exactly llama.cpp's own measure of the
projector (mtmd_get_memory_usage, called here by its own ctypes), and by what a real run of the
projector allocated (its session's memory_alloc records of purpose encoder_weights and
encoder_compute, counted here), to the byte; for a projector whose tensors are not multiples of
the buffer's alignment, the run's weights are more by exactly that padding. Under a memory budget
the projector's room comes out of the context: the context fit names runs with the projector
loaded and an image encoded, and one step more leaves no room for the projector. On an RPC server
(a GPU to llama.cpp) the encoder goes where a run puts it; --measure runs instr run --mmproj with
the projector placed as fit counted it, --no-mmproj-offload included.

libmtmd is the wheel's (llama_cpp.mtmd_cpp: llama_cpp/lib, or MTMD_CPP_LIB)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import gguf
import pytest
from helpers.mmproj_gguf import write_audio_mmproj, write_vision_mmproj
from helpers.mtmd_input import ON_PATH
from helpers.support import assert_one_line_error, instr, read_log

pytestmark = pytest.mark.native

MIB = 1 << 20
ENCODER = ("encoder_weights", "encoder_compute")


@pytest.fixture(scope="module")
def projectors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A vision and an audio projector for SmolLM2, a vision one large enough (10 MiB) that its
    room is more than a context step of SmolLM2's KV cache (5.6 MiB a 256 cells), and one for the
    tiny models (256 wide)."""
    folder = tmp_path_factory.mktemp("mmproj")
    return {
        "gemma3": write_vision_mmproj(folder / "gemma3.gguf", projector="gemma3"),
        "qwen2a": write_audio_mmproj(folder / "qwen2a.gguf", projector="qwen2a"),
        "large": write_vision_mmproj(
            folder / "large.gguf", projector="gemma3", n_embd=256, n_ff=1024, n_layer=6, seed=1
        ),
        "tiny": write_vision_mmproj(folder / "tiny.gguf", projector="gemma3", n_embd_text=256),
        # f32 norms and biases of 60 floats: 240 bytes, not a multiple of 32
        "unaligned": write_vision_mmproj(
            folder / "unaligned.gguf", projector="gemma3", n_embd=60, n_ff=200
        ),
    }


def child(script: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """``script`` run in a Python child with ``args``: its last line of stdout, as JSON."""
    r = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# llama.cpp's own measure, as llama-server's fit takes it: mtmd_get_memory_usage (a C++ function
# returning a std::map<ggml_backend_dev_t, size_t>, passed back through a hidden first argument on
# x86-64; libstdc++'s map: the tree's root at word 2, each node's left and right children at words
# 2 and 3, its key and value at 4 and 5) with mtmd's default parameters, warmup on
LLAMA_MEASURE = r"""
import ctypes, json, sys
import llama_cpp
import llama_cpp.mtmd_cpp as mtmd

llama_cpp.llama_backend_init()
lib = llama_cpp.llama_cpp._lib
lib.ggml_backend_dev_name.restype = ctypes.c_char_p
lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
fn = mtmd._libmtmd._Z21mtmd_get_memory_usagePKc19mtmd_context_params
fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, mtmd.mtmd_context_params]
fn.restype = ctypes.c_void_p
out = (ctypes.c_uint64 * 6)()
fn(ctypes.addressof(out), sys.argv[1].encode(), mtmd.mtmd_context_params_default())
measure, todo = {}, [out[2]]
while todo:
    node = todo.pop()
    if node:
        w = (ctypes.c_uint64 * 6).from_address(node)
        measure[lib.ggml_backend_dev_name(w[4]).decode()] = w[5]
        todo += [w[2], w[3]]
print(json.dumps(measure))
"""


# the C function this package reads (mtmd_instr_memory_usage, through native.mtmd_memory) against
# the C++ function it wraps (mtmd_get_memory_usage), read as LLAMA_MEASURE reads it, for each
# projector given, weights alone (warmup off) and with the compute buffers (on), on the CPU and, with
# an RPC server given, offloaded to it: [projector, warmup, offloaded, the C++ map, the C answer],
# devices by name
OLD_AND_NEW = r"""
import ctypes, json, sys
from pathlib import Path
import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
from llamacpp_instr.native import mtmd_memory
from llamacpp_instr.running import devices

llama_cpp.llama_backend_init()
rpc, *paths = sys.argv[1:]
devices.add_rpc_servers((rpc,) if rpc else ())
names = {d.ptr: d.name for d in devices.registry()}
fn = mtmd._libmtmd._Z21mtmd_get_memory_usagePKc19mtmd_context_params
fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, mtmd.mtmd_context_params]
fn.restype = ctypes.c_void_p

def cpp(path, params):
    out = (ctypes.c_uint64 * 6)()
    fn(ctypes.addressof(out), path.encode(), params)
    found, todo = {}, [out[2]]
    while todo:
        node = todo.pop()
        if node:
            w = (ctypes.c_uint64 * 6).from_address(node)
            found[names[w[4]]] = w[5]
            todo += [w[2], w[3]]
    return found

rows = []
for path in paths:
    for warmup in (False, True):
        for offloaded in ((False, True) if rpc else (False,)):
            params = mtmd.mtmd_context_params_default()
            params.use_gpu = offloaded
            params.warmup = warmup
            old = cpp(path, params)
            new = mtmd_memory.memory_usage(mtmd, Path(path), params, warmup)
            rows.append([Path(path).stem, warmup, offloaded, old, {names[d]: n for d, n in new.items()}])
print(json.dumps(rows))
"""


def test_the_c_function_answers_what_the_cpp_function_returns(
    instr_api: Any, projectors: dict[str, Path], tmp_path: Path
) -> None:
    """mtmd_instr_memory_usage, which fit reads, gives each device's bytes as the C++
    mtmd_get_memory_usage it wraps returns them, to the byte: every projector type the tests
    write (and this file's), weights alone and with the compute buffers, on the CPU and offloaded
    to an RPC server (its weights there, a compute buffer on each device)."""
    from helpers.mmproj_gguf import (
        AUDIO_PROJECTORS,
        VISION_PROJECTORS,
        write_audio_mmproj,
        write_vision_mmproj,
    )
    from helpers.rpc_backend import rpc_server

    paths = [write_vision_mmproj(tmp_path / f"{p}.gguf", projector=p) for p in VISION_PROJECTORS]
    paths += [write_audio_mmproj(tmp_path / f"{p}.gguf", projector=p) for p in AUDIO_PROJECTORS]
    paths += list(projectors.values())
    with rpc_server() as endpoint:
        rows = child(OLD_AND_NEW, endpoint, *map(str, paths))
    assert len(rows) == 4 * len(paths)
    for name, warmup, offloaded, old, new in rows:
        assert new == old and old, (name, warmup, offloaded, old, new)
        assert set(old) == (
            {"CPU", "RPC0"} if offloaded and warmup else {"RPC0"} if offloaded else {"CPU"}
        )
    print(json.dumps(rows))  # (the figures, with -s)


# mtmd_instr_memory_usage's return codes, called as ctypes calls it: arguments it refuses (-1,
# nothing written), a file mtmd cannot load (0), arrays too small (the count, only their room
# written), no arrays (the count); a projector offloaded to an RPC server, whose warmup puts a
# compute buffer on the CPU too: two devices
RETURN_CODES = r"""
import ctypes, json, sys
import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
from llamacpp_instr.running import devices

llama_cpp.llama_backend_init()
good, bad, rpc = sys.argv[1:]
devices.add_rpc_servers((rpc,))
fn = mtmd._libmtmd.mtmd_instr_memory_usage
fn.restype = ctypes.c_int32
fn.argtypes = [ctypes.c_char_p, ctypes.POINTER(mtmd.mtmd_context_params),
               ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint64), ctypes.c_int32]
p = ctypes.byref(mtmd.mtmd_context_params_default())
devs = (ctypes.c_void_p * 4)()
sizes = (ctypes.c_uint64 * 4)(7, 7, 7, 7)
good, bad = good.encode(), bad.encode()
out = {
    "no name": fn(None, p, devs, sizes, 4),
    "no params": fn(good, None, devs, sizes, 4),
    "negative room": fn(good, p, devs, sizes, -1),
    "no arrays": fn(good, p, None, None, 4),
    "untouched": list(sizes),
    "not a projector": fn(bad, p, devs, sizes, 4),
    "no file": fn(b"/nonexistent.gguf", p, devs, sizes, 4),
    "count only": fn(good, p, None, None, 0),
    "room for one": fn(good, p, devs, sizes, 1),
    "after room for one": [bool(devs[0]), sizes[0] != 7, devs[1], sizes[1]],
}
print(json.dumps(out))
"""


def test_the_c_functions_return_codes(
    instr_api: Any, projectors: dict[str, Path], tmp_path: Path
) -> None:
    from helpers.rpc_backend import rpc_server

    not_projector = tmp_path / "text.gguf"
    not_projector.write_text("not a projector\n")
    with rpc_server() as endpoint:
        out = child(RETURN_CODES, str(projectors["tiny"]), str(not_projector), endpoint)
    assert out == {
        "no name": -1,
        "no params": -1,
        "negative room": -1,
        "no arrays": -1,
        "untouched": [7, 7, 7, 7],
        "not a projector": 0,
        "no file": 0,
        "count only": 2,
        "room for one": 2,
        "after room for one": [True, True, None, 7],
    }


# a real run: instr run's model and context (runner.load_model) at a setting (context, KV cache
# type, flash attention; RPC servers given after it become devices) in a session, then the projector loaded by mtmd_init_from_file with the
# text model's flash attention, as llama-server and llama-mtmd-cli load it (mtmd's warmup reserves
# the compute buffers), and unless told "load" one input encoded as large as the largest it takes
# (an image is resized to the projector's size; a sound is padded to whisper's 30 s chunk: one of
# 1 s). A compute buffer the warmup could not allocate is not said: mtmd_init_from_file succeeds,
# and an encode then crashes.
REAL_RUN = ON_PATH + r"""
import json, sys
from pathlib import Path
import llama_cpp.mtmd_cpp as mtmd
from helpers import mtmd_input
import llamacpp_instr
from llamacpp_instr.running import context_defaults, runner
from llamacpp_instr.running.offload import Offload

model, mmproj, log, n_ctx, kv, flash, what, *rpc = sys.argv[1:]
flash_attn = {"auto": None, "on": True, "off": False}[flash]
cfg = runner.RunConfig(
    model=Path(model), prompt="", n_ctx=int(n_ctx), type_k=kv, type_v=kv, flash_attn=flash_attn,
    offload=Offload(rpc=tuple(rpc)),
)
llm = runner.load_model(cfg)
with llamacpp_instr.session(llm, log, level="minimal"):
    params = mtmd.mtmd_context_params_default()
    params.n_threads = 2
    params.flash_attn_type = context_defaults.flash_attn_type(flash_attn)
    ctx = mtmd.mtmd_init_from_file(mmproj.encode(), llm.model, params)
    assert ctx
    if what == "load":
        mtmd.mtmd_free(ctx)
        print(json.dumps({"encoded": 0}))
        sys.exit(0)
    bmp = mtmd_input.medium(mtmd, ctx, 320, 240)
    chunks = mtmd_input.look_chunks(mtmd, ctx, bmp)
    encoded = 0
    for i in range(mtmd.mtmd_input_chunks_size(chunks)):
        chunk = mtmd.mtmd_input_chunks_get(chunks, i)
        if mtmd.mtmd_input_chunk_get_type(chunk) != mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
            assert mtmd.mtmd_encode_chunk(ctx, chunk) == 0
            encoded += 1
    mtmd.mtmd_input_chunks_free(chunks)
    mtmd.mtmd_bitmap_free(bmp)
    mtmd.mtmd_free(ctx)
print(json.dumps({"encoded": encoded}))
"""


def allocated(log: Path) -> dict[str, dict[str, int]]:
    """{device: {purpose: bytes}} of every encoder buffer the log's session allocated."""
    records = read_log(log)
    names = {d["index"]: d["name"] for d in records[0]["machine"]["devices"]}
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in records:
        if r["type"] == "memory_alloc" and r["purpose"] in ENCODER and r["bytes"]:
            out[names[r["device"]]][r["purpose"]] += r["bytes"]
    return {dev: dict(p) for dev, p in out.items()}


def encoder_share(footprint: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The encoder's purposes of a footprint, per device."""
    out = {
        dev: {p: n for p, n in purposes.items() if p in ENCODER}
        for dev, purposes in footprint.items()
    }
    return {dev: p for dev, p in out.items() if p}


def real_run(
    model: Path,
    mmproj: Path,
    log: Path,
    n_ctx: int,
    answer: dict[str, Any],
    what: str,
    *rpc: str,
    env: dict[str, str] | None = None,
) -> Any:
    """REAL_RUN at ``n_ctx`` with the KV cache and flash attention of fit's ``answer``."""
    assert answer["type_k"] == answer["type_v"], answer
    setting = [str(n_ctx), answer["type_k"], answer["flash_attn"], what, *rpc]
    return child(REAL_RUN, str(model), str(mmproj), str(log), *setting, env=env)


def fit_json(*args: str) -> dict[str, Any]:
    r = instr("fit", *args, "--format", "json")
    assert r.returncode == 0, r.stderr
    (answer,) = json.loads(r.stdout)
    return dict(answer)


@pytest.mark.parametrize("name", ["gemma3", "qwen2a"])
def test_fit_counts_the_projector_as_llama_measures_it_and_a_run_allocates_it(
    instr_api: Any, smollm2_path: Path, projectors: dict[str, Path], name: str, tmp_path: Path
) -> None:
    mmproj = projectors[name]
    without = fit_json(str(smollm2_path), "--ctx", "1024")
    with_ = fit_json(str(smollm2_path), "--ctx", "1024", "--mmproj", str(mmproj))
    assert with_["n_ctx"] == without["n_ctx"] == 1024 and with_["mmproj"] == str(mmproj)

    # the footprints differ by the encoder's two purposes on the CPU (no GPU here), nothing else
    added = {
        dev: {p: n - without["footprint"].get(dev, {}).get(p, 0) for p, n in purposes.items()}
        for dev, purposes in with_["footprint"].items()
    }
    added = {dev: {p: n for p, n in ps.items() if n} for dev, ps in added.items()}
    assert set(added) == {"CPU"} and set(added["CPU"]) == set(ENCODER), added
    assert all(n > 0 for n in added["CPU"].values())

    # exactly llama.cpp's measure of it
    assert child(LLAMA_MEASURE, str(mmproj)) == {"CPU": sum(added["CPU"].values())}

    # and what a real run allocated for it, per purpose, to the byte
    log = tmp_path / "run.log"
    assert real_run(smollm2_path, mmproj, log, 1024, with_, "encode") == {"encoded": 1}
    assert allocated(log) == added


def test_a_run_pads_the_weights_llamas_measure_counts_unpadded(
    instr_api: Any, smollm2_path: Path, projectors: dict[str, Path], tmp_path: Path
) -> None:
    """llama.cpp's measure (and so fit) counts the weights as their tensors' bytes; a run's buffer
    pads each tensor to the CPU buffer's alignment, 32 bytes: with tensors that are not multiples
    of it, the run holds exactly that padding more (read here from the file's tensors). The
    compute buffers are equal."""
    mmproj = projectors["unaligned"]
    answer = fit_json(str(smollm2_path), "--ctx", "256", "--mmproj", str(mmproj))
    tensors = gguf.GGUFReader(mmproj).tensors
    padding = sum(-int(t.n_bytes) % 32 for t in tensors)
    assert padding > 0
    counted = encoder_share(answer["footprint"])["CPU"]
    assert counted["encoder_weights"] == sum(int(t.n_bytes) for t in tensors)
    log = tmp_path / "run.log"
    assert real_run(smollm2_path, mmproj, log, 256, answer, "encode") == {"encoded": 1}
    held = allocated(log)["CPU"]
    assert held["encoder_weights"] == counted["encoder_weights"] + padding
    assert held["encoder_compute"] == counted["encoder_compute"]


def test_measure_runs_the_projector_and_finds_its_buffers(
    instr_api: Any, smollm2_path: Path, projectors: dict[str, Path]
) -> None:
    """--measure runs instr run --mmproj: the buffers live at its last step hold the projector's,
    as fit counted them, to the byte."""
    mmproj = projectors["qwen2a"]
    answer = fit_json(str(smollm2_path), "--ctx", "1024", "--mmproj", str(mmproj), "--measure")
    assert encoder_share(answer["measured"]) == encoder_share(answer["footprint"])
    assert set(encoder_share(answer["footprint"])["CPU"]) == set(ENCODER), answer


def test_measure_with_no_mmproj_offload_finds_the_projector_on_the_cpu(
    instr_api: Any, tiny_llama_f32: Path, projectors: dict[str, Path]
) -> None:
    """--measure --no-mmproj-offload runs instr run with the encoder kept on the CPU: the buffers
    live at its last step hold the projector's there, as fit counted them."""
    mmproj = projectors["tiny"]
    common = [str(tiny_llama_f32), "--ctx", "256", "--mmproj", str(mmproj)]
    answer = fit_json(*common, "--no-mmproj-offload", "--measure")
    assert answer["mmproj_offload"] is False
    share = encoder_share(answer["footprint"])
    assert set(share) == {"CPU"} and set(share["CPU"]) == set(ENCODER), answer
    assert encoder_share(answer["measured"]) == share


# footprint_checks.measured_run, as fit's --measure calls it, at the setting of fit's answer with
# an RPC server (fit itself can't share one with its measuring run: a server serves one client at
# a time), the projector's placement as given: the measured buffers
MEASURED_RUN = r"""
import json, sys
from pathlib import Path
from llamacpp_instr.running import footprint_checks
from llamacpp_instr.running.offload import Offload
from llamacpp_instr.running.run_config import MediaInputs, RunConfig

model, mmproj, n_ctx, kv, flash, offloaded, rpc = sys.argv[1:]
cfg = RunConfig(
    model=Path(model), prompt="", n_ctx=int(n_ctx), type_k=kv, type_v=kv,
    flash_attn={"auto": None, "on": True, "off": False}[flash], offload=Offload(rpc=(rpc,)),
)
media = MediaInputs(mmproj=Path(mmproj), offload=offloaded == "on")
print(json.dumps(footprint_checks.measured_run(cfg, {}, media)))
"""


@pytest.mark.parametrize("offloaded", [True, False], ids=["default", "no-mmproj-offload"])
def test_the_measuring_run_places_the_projector_where_fit_counted_it(
    instr_api: Any, tiny_llama_f32: Path, projectors: dict[str, Path], offloaded: bool
) -> None:
    """With an RPC server (a GPU to llama.cpp), the measuring run's encoder buffers are on the
    devices and of the bytes fit counted with the same --no-mmproj-offload: the server's and the
    CPU's when offloaded, the CPU's alone when not."""
    from helpers.rpc_backend import rpc_server

    mmproj = projectors["tiny"]
    placing = () if offloaded else ("--no-mmproj-offload",)
    common = [str(tiny_llama_f32), "--ctx", "256", "--mmproj", str(mmproj), *placing]
    with rpc_server() as endpoint:
        answer = fit_json(*common, "--rpc", endpoint)
        assert answer["type_k"] == answer["type_v"], answer
        setting = [str(answer["n_ctx"]), answer["type_k"], answer["flash_attn"]]
        on = "on" if offloaded else "off"
        measured = child(MEASURED_RUN, str(tiny_llama_f32), str(mmproj), *setting, on, endpoint)
    share = encoder_share(answer["footprint"])
    assert set(share) == ({"RPC0", "CPU"} if offloaded else {"CPU"}), share
    assert encoder_share(measured) == share


def test_the_projectors_room_comes_out_of_the_context(
    instr_api: Any, smollm2_path: Path, projectors: dict[str, Path], tmp_path: Path
) -> None:
    """Under 260 MiB the context with the large projector is shorter; the one fit names runs the
    projector on an image under that budget, and one step more leaves it no room: the text
    model's share fits, the projector's buffers do not."""
    mmproj = projectors["large"]
    budget = 260 * MIB
    without = fit_json(str(smollm2_path), "--memory", f"CPU={budget}")
    with_ = fit_json(str(smollm2_path), "--memory", f"CPU={budget}", "--mmproj", str(mmproj))
    encoder = sum(with_["footprint"]["CPU"].get(p, 0) for p in ENCODER)
    assert encoder > 6 * MIB, with_["footprint"]
    n_ctx = with_["n_ctx"]
    assert n_ctx < without["n_ctx"], (n_ctx, without["n_ctx"])
    assert sum(with_["footprint"]["CPU"].values()) <= budget

    env = {"LLAMA_INSTR_MEMORY_BUDGET": f"CPU={budget}"}
    log = tmp_path / "fits.log"
    assert real_run(smollm2_path, mmproj, log, n_ctx, with_, "encode", env=env) == {"encoded": 1}
    assert not [r for r in read_log(log) if r["type"] == "memory_alloc_failed"]
    log = tmp_path / "beyond.log"
    assert real_run(smollm2_path, mmproj, log, n_ctx + 256, with_, "load", env=env)
    failed = [r for r in read_log(log) if r["type"] == "memory_alloc_failed"]
    assert [r["purpose"] for r in failed] in (["encoder_weights"], ["encoder_compute"]), failed
    assert all(r["by_budget"] for r in failed)


def test_the_encoder_goes_to_the_gpu_llama_cpp_gives_it(
    instr_api: Any, tiny_llama_f32: Path, projectors: dict[str, Path], tmp_path: Path
) -> None:
    """An RPC server is a GPU to llama.cpp: the encoder's weights go there (with a compute buffer
    there and one on the CPU, the scheduler's), as a real run on the same server allocates them;
    --no-mmproj-offload and --device none keep it on the CPU."""
    from helpers.rpc_backend import rpc_server

    mmproj = projectors["tiny"]
    common = [str(tiny_llama_f32), "--ctx", "256", "--mmproj", str(mmproj)]
    with rpc_server() as endpoint:
        offloaded = fit_json(*common, "--rpc", endpoint)
        kept = fit_json(*common, "--rpc", endpoint, "--no-mmproj-offload")
        log = tmp_path / "rpc.log"
        got = real_run(tiny_llama_f32, mmproj, log, 256, offloaded, "encode", endpoint)
    assert got == {"encoded": 1}, got
    share = encoder_share(offloaded["footprint"])
    assert set(share["RPC0"]) == set(ENCODER), share
    assert allocated(log) == share
    assert set(encoder_share(kept["footprint"])) == {"CPU"}, kept["footprint"]
    assert set(encoder_share(fit_json(*common, "--device", "none")["footprint"])) == {"CPU"}


@pytest.mark.parametrize(
    "placing",
    [(), ("--no-mmproj-offload",), ("--device", "RPC0", "-ngl", "all")],
    ids=["default", "no-mmproj-offload", "device-rpc0"],
)
def test_instr_run_places_the_projector_where_fit_counted_it(
    instr_api: Any,
    tiny_llama_f32: Path,
    projectors: dict[str, Path],
    media: dict[str, Path],
    tmp_path: Path,
    placing: tuple[str, ...],
) -> None:
    """With an RPC server (a GPU to llama.cpp), instr run --mmproj allocates the encoder's buffers
    on the devices and in the bytes instr fit --mmproj counted with the same placement options:
    mtmd's parameters are built by one function for both (the first --device, else the first
    GPU; the CPU with --no-mmproj-offload, which instr run did not take: it always offloaded)."""
    from helpers.rpc_backend import rpc_server

    mmproj = projectors["tiny"]
    common = [str(tiny_llama_f32), "--ctx", "256", "--mmproj", str(mmproj), *placing]
    log = tmp_path / "run.log"
    with rpc_server() as endpoint:
        answer = fit_json(*common, "--rpc", endpoint)
        r = instr(
            "run", *common, "--rpc", endpoint, "--image", str(media["test-1.jpeg"]), "-n", "1",
            "-p", "hi", "-o", str(log),
        )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    share = encoder_share(answer["footprint"])
    offloaded = placing in ((), ("--device", "RPC0", "-ngl", "all"))
    assert set(share) == ({"RPC0", "CPU"} if offloaded else {"CPU"}), share
    assert allocated(log) == share


def test_the_text_report_names_the_projector_and_its_purposes(
    instr_api: Any, tiny_llama_f32: Path, projectors: dict[str, Path]
) -> None:
    r = instr("fit", str(tiny_llama_f32), "--ctx", "256", "--mmproj", str(projectors["tiny"]))
    assert r.returncode == 0, r.stderr
    assert f"with the projector {projectors['tiny']}" in r.stdout
    header = next(line for line in r.stdout.splitlines() if line.startswith("device"))
    assert header.split()[-3:] == ["encoder_weights", "encoder_compute", "total"], header


@pytest.mark.parametrize(
    "which, says",
    [
        ("missing", "--mmproj: model file not found"),
        ("text", "--mmproj: not a GGUF file"),
        ("model", "is not a projector (mmproj) file: its architecture is llama"),
        ("truncated", "is not a projector (mmproj) file: its architecture is unknown"),
        ("no-encoder", "llama.cpp's mtmd cannot load it"),
        ("no-libmtmd", "this llama-cpp-python build has no libmtmd"),
        ("experts", "not in --experts' placements"),
    ],
)
def test_a_bad_mmproj_is_one_line_exit_2(
    instr_api: Any,
    tiny_llama_f32: Path,
    projectors: dict[str, Path],
    tmp_path: Path,
    which: str,
    says: str,
) -> None:
    good = projectors["tiny"]
    files = {
        "missing": tmp_path / "nope.gguf",
        "text": tmp_path / "notes.txt",
        "model": tiny_llama_f32,
        "truncated": tmp_path / "cut.gguf",
    }
    files["text"].write_text("not a projector\n")
    files["truncated"].write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    files["no-encoder"] = tmp_path / "no-encoder.gguf"  # a projector's architecture, nothing else
    writer = gguf.GGUFWriter(str(files["no-encoder"]), "clip")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    args = [str(tiny_llama_f32), "--ctx", "256", "--mmproj", str(files.get(which, good))]
    env = {}
    if which == "experts":
        args.append("--experts")
    if which == "no-libmtmd":  # a folder without libmtmd where llama_cpp.mtmd_cpp looks
        env["MTMD_CPP_LIB"] = str(tmp_path)
    assert_one_line_error(instr("fit", *args, env=env), says)
