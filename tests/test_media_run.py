"""An image's and a sound's way through a run, as the log records it: `instr run --mmproj --image
--audio`, llama-mtmd-cli under `instr exec`, and llama-cpp-python's multimodal chat handler in a
session, each checked against what llama.cpp itself says (llama-mtmd-cli's "encoding done" and
"decoded (batch i/n)" lines, the helper's "slice encoded" lines), against the projector's shapes
(the tokens an image costs), and against a run with no session (the same text).

The projectors are random-weight ones tests/helpers/mmproj_gguf.py writes for the bundled
SmolLM2-135M; the media are mtmd's own test files from the pinned sdist (conftest's fixtures).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.support import by_type, read_log, realtime

pytestmark = pytest.mark.native

# the idefics3 projector at the writer's defaults: a 256-pixel tile of 16-pixel patches, folded by
# 4: (256 / 16 / 4) ** 2 tokens a slice, and mtmd cuts test-1.jpeg into an overview and one tile
IDEFICS3_TOKENS_PER_SLICE = (256 // 16 // 4) ** 2


def _env(lib: Path) -> dict[str, str]:
    return dict(os.environ, LLAMA_CPP_LIB_PATH=str(lib), MTMD_CPP_LIB=str(lib))


def _steps(recs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(step_begin, step_end) pairs, in the order the steps ended."""
    begins = {(r["ctx"], r["step"]): r for r in by_type(recs, "step_begin")}
    return [(begins[(e["ctx"], e["step"])], e) for e in by_type(recs, "step_end")]


def _encodes(recs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(b, e) for b, e in _steps(recs) if b["kind"] == "encode"]


def _media_steps(recs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(b, e) for b, e in _steps(recs) if b["kind"] != "encode" and "media" in b]


def _instr(
    lib: Path, *args: str, cwd: Path, prefix: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(prefix or []), sys.executable, "-c", "from llamacpp_instr.cli import main; main()"]
        + list(args),
        env=_env(lib),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_an_image_run_records_each_slice_its_encode_and_its_decode(
    mm_lib: Path,
    projectors: dict[str, Path],
    vlm_text: Path,
    media: dict[str, Path],
    tmp_path: Path,
) -> None:
    """instr run with an idefics3 projector and test-1.jpeg given twice: each image is a `media`
    record (its size and bytes from the JPEG's own pixels, two slices of 16 tokens, the same hash
    twice), each slice an encode of its own naming it, the first of them marked first; the
    steps that decode its embeddings name it and hold its tokens; its encode's ops are in the
    encoder's blocks and its projector."""
    image = media["test-1.jpeg"]
    r = _instr(
        mm_lib,
        "run",
        str(vlm_text),
        "--mmproj",
        str(projectors["idefics3"]),
        "--image",
        str(image),
        "--image",
        str(image),
        "-p",
        "Describe the images.",
        "-n",
        "4",
        "-o",
        str(tmp_path / "run.log"),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    recs = read_log(tmp_path / "run.log")
    assert recs[0]["schema_version"] == 4 and recs[-1]["status"] == "ok"
    meds = by_type(recs, "media")
    assert [m["id"] for m in meds] == [meds[0]["id"], meds[0]["id"] + 1]
    for m in meds:
        assert (m["kind"], m["nx"], m["ny"]) == ("image", 640, 488)
        assert m["bytes"] == 640 * 488 * 3 and m["slices"] == 2
        assert m["tokens"] == m["n_pos"] == 2 * IDEFICS3_TOKENS_PER_SLICE
        assert m["load"][1] > 0 and m["preprocess"][1] > 0
    assert meds[0]["hash"] == meds[1]["hash"]
    [ctx] = [c for c in by_type(recs, "context") if c["role"] == "encoder"]
    assert ctx["model"]["architecture"] == "idefics3" and ctx["encoder"]["n_embd_out"] == 576
    encodes = _encodes(recs)
    slices = [tuple(s) for b, _ in encodes for s in b["media"]]
    assert slices == [(m["id"], i) for m in meds for i in range(2)]
    assert [b["first"] for b, _ in encodes] == [True, False, False, False]
    for b, e in encodes:
        assert b["ctx"] == ctx["ctx"] and b["target"] == [1, 0]
        assert b["n_tokens"] == e["n_tokens"] == IDEFICS3_TOKENS_PER_SLICE and e["status"] == 0
        assert e["logits"]["shape"] == [576, IDEFICS3_TOKENS_PER_SLICE]
    decoded: dict[tuple[int, int], int] = {}
    for b, _ in _media_steps(recs):
        key = (b["media"][0], b["media"][1])
        decoded[key] = decoded.get(key, 0) + b["n_tokens"]
    assert decoded == {s: IDEFICS3_TOKENS_PER_SLICE for s in slices}
    # the encoder's layers: its two blocks, its projector (layer 2); its input's embedding (-1)
    n_layer = ctx["model"]["n_layer"]
    comp = [c for c in by_type(recs, "compute") if c["ctx"] == ctx["ctx"]]
    assert len(comp) == len(encodes)
    for c in comp:
        assert sorted(layer[0] for layer in c["layers"]) == list(range(n_layer + 1))


# The nodes clip.cpp builds for each projector of the writer after the encoder's last block, as
# its code at the pin reads (models/llava.cpp, siglip.cpp, build_vit, ggml's conv functions),
# ggml's views (RESHAPE, PERMUTE, TRANSPOSE) and copies (CONT) among them: the encoder's own
# post-norm where it has one (of no block, after the blocks) and LLaVA's reshape and rows of
# the patches are the projector's too. UNARY is a GELU, hard swish, ReLU or hard sigmoid.
_LN = "NORM MUL ADD"
_LLAVA = "RESHAPE GET_ROWS"
_MLP = "MUL_MAT ADD UNARY MUL_MAT ADD"
_DW = "RESHAPE RESHAPE IM2COL RESHAPE RESHAPE MUL_MAT RESHAPE"  # ggml_conv_2d_dw
_CONV = "IM2COL RESHAPE RESHAPE MUL_MAT RESHAPE PERMUTE CONT"  # ggml_conv_2d
_MOBILENET = (  # a depthwise conv, a norm, a hard swish, a squeeze-and-excite, a pointwise matrix
    f"{_DW} PERMUTE CONT {_LN} PERMUTE CONT UNARY POOL_2D RESHAPE MUL_MAT ADD UNARY MUL_MAT ADD "
    f"UNARY RESHAPE MUL RESHAPE PERMUTE CONT MUL_MAT RESHAPE {_LN}"
)
PROJECTOR_OPS = {
    "mlp": f"{_LLAVA} {_MLP}",
    "mlp_norm": f"{_LLAVA} MUL_MAT ADD {_LN} UNARY MUL_MAT ADD {_LN}",
    "ldp": f"{_LLAVA} {_MLP} PERMUTE CONT {_MOBILENET} PERMUTE CONT ADD {_MOBILENET} RESHAPE",
    "ldpv2": f"{_LLAVA} {_MLP} PERMUTE CONT POOL_2D {_DW} PERMUTE CONT ADD PERMUTE CONT ADD RESHAPE",
    "adapter": f"{_LN} PERMUTE CONT {_CONV} RESHAPE PERMUTE CONT ADD MUL_MAT {_LN} UNARY "
    "MUL_MAT MUL_MAT GLU MUL_MAT CONCAT CONCAT",
    "gemma3": f"{_LN} RESHAPE TRANSPOSE CONT POOL_2D RESHAPE TRANSPOSE CONT RMS_NORM MUL "
    "TRANSPOSE CONT MUL_MAT",
    "idefics3": f"{_LN} RESHAPE RESHAPE RESHAPE PERMUTE CONT PERMUTE CONT MUL_MAT",
}


def _projector_nodes(nodes: list[dict[str, Any]], weights: set[str]) -> set[int]:
    """The projector's nodes found from clip's names and the writer's tensors, not from the
    layers recorded: the nodes after the last block's output (clip names it layer_out-N), and
    those computed from the projector's weights alone (ggml puts a view or copy of a weight
    where the graph's last expansion first reaches it: inside the last block, for some)."""
    last = max(n["i"] for n in nodes if re.fullmatch(r"layer_out-\d+", n["name"]))
    alone: set[int] = set()
    for n in nodes:
        if n["src"] and all(s.get("node") in alone or s.get("name") in weights for s in n["src"]):
            alone.add(n["i"])
    return {n["i"] for n in nodes if n["i"] > last} | alone


@pytest.mark.parametrize("projector", sorted(PROJECTOR_OPS))
def test_a_projector_built_without_names_is_the_projectors(
    projector: str,
    mm_lib: Path,
    projectors: dict[str, Path],
    vlm_text: Path,
    media: dict[str, Path],
    tmp_path: Path,
) -> None:
    """Projectors clip builds with no callback naming their nodes (ggml names them node_N),
    LLaVA-1.5's `mlp` (two matrices and a GELU after the vision tower) first: their nodes are in
    the projector's layer (the encoder's n_layer), not in the last block, and they are the
    nodes and ops clip builds for it, the views and copies of its weights that ggml puts inside
    the last block among them (gemma3's transposed matrix, MobileVLM's depthwise kernels); each
    encode's compute has a span of that layer, and `instr summary` gives the image the time of
    their ops as its projector's."""
    import gguf

    log = tmp_path / f"{projector}.log"
    args = ["--mmproj", str(projectors[projector]), "--image", str(media["test-1.jpeg"])]
    r = _instr(
        mm_lib,
        "run",
        str(vlm_text),
        *args,
        "-p",
        "Describe.",
        "-n",
        "2",
        "-o",
        str(log),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    recs = read_log(log)
    [ctx] = [c for c in by_type(recs, "context") if c["role"] == "encoder"]
    # (Yi-VL's type, which clip takes from an mlp file with mm.3, by the loader's own name)
    assert ctx["model"]["architecture"] == projector
    n_layer = ctx["model"]["n_layer"]
    reader = gguf.GGUFReader(str(projectors[projector]))
    weights = {t.name for t in reader.tensors if not t.name.startswith("v.")}
    graphs = {g["graph"]: g["nodes"] for g in by_type(recs, "graph") if g["ctx"] == ctx["ctx"]}
    assert graphs
    for nodes in graphs.values():
        mine = _projector_nodes(nodes, weights)
        assert {n["i"] for n in nodes if n["layer"] == n_layer} == mine, projector
        ops = sorted(nodes[i]["op"] for i in mine)
        assert ops == sorted(PROJECTOR_OPS[projector].split()), projector
        read = {s.get("name") for i in mine for s in nodes[i]["src"]}
        assert weights <= read  # every weight of the projector, read by its nodes
    computes = [c for c in by_type(recs, "compute") if c["ctx"] == ctx["ctx"]]
    assert computes and all(n_layer in {span[0] for span in c["layers"]} for c in computes)
    parts = {"blocks": 0, "projector": 0}
    for c in computes:
        for op in c["ops"]:  # (node, start, duration, ...)
            layer, dur = graphs[c["graph"]][op[0]]["layer"], op[2]
            if layer is not None and 0 <= layer < n_layer:
                parts["blocks"] += dur
            elif layer == n_layer:
                parts["projector"] += dur
    r = _instr(mm_lib, "summary", str(log), "--format", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    [row] = json.loads(r.stdout)["media"]
    assert row["projector_ms"] > 0
    assert row["projector_ms"] == pytest.approx(parts["projector"] / 1e6, abs=1e-9)
    assert row["blocks_ms"] == pytest.approx(parts["blocks"] / 1e6, abs=1e-9)
    print(projector, len(mine), parts)  # (the figures, with -s)


# case: (the media given, the --mmproj given: a projector, "model" for the text model, None for
# none, and what the one line says)
BAD: dict[str, tuple[list[str], str | None, str]] = {
    "not-an-image": (["--image", "{text}"], "gemma3", "not an image"),
    "truncated-jpeg": (["--image", "{truncated}"], "gemma3", "cut short"),
    "zero-side": (["--image", "{zero}"], "gemma3", "0x10 pixels"),
    "huge-side": (["--image", "{huge}"], "gemma3", "100000x100000 pixels"),
    "a-sound-as-image": (["--image", "{sound}"], "gemma3", "a sound, not an image"),
    "sound-to-vision": (["--audio", "{sound}"], "gemma3", "this projector takes no audio"),
    "width-mismatch": (["--image", "{jpeg}"], "idefics3-512", "mismatch between text model"),
    "model-as-projector": (["--image", "{jpeg}"], "model", "not a projector"),
    "no-projector": (["--image", "{jpeg}"], None, "need --mmproj"),
}


def _bad_files(tmp: Path, media: dict[str, Path]) -> dict[str, str]:
    import struct
    import zlib

    def png(width: int, height: int) -> bytes:
        def chunk(kind: bytes, data: bytes) -> bytes:
            crc = struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
            return struct.pack(">I", len(data)) + kind + data + crc

        ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\0" * 13))
            + chunk(b"IEND", b"")
        )

    jpeg = media["test-1.jpeg"].read_bytes()
    files = {
        "text": ("text.jpg", b"this is not an image\n"),
        "truncated": ("cut.jpg", jpeg[: len(jpeg) // 2]),
        "zero": ("zero.png", png(0, 10)),
        "huge": ("huge.png", png(100_000, 100_000)),
    }
    out = {"jpeg": str(media["test-1.jpeg"]), "sound": str(media["test-2.mp3"])}
    for key, (name, data) in files.items():
        (tmp / name).write_bytes(data)
        out[key] = str(tmp / name)
    return out


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_media_end_in_one_line_and_no_log(
    case: str,
    mm_lib: Path,
    projectors: dict[str, Path],
    media: dict[str, Path],
    smollm2_path: Path,
    tmp_path: Path,
) -> None:
    """Each bad input: exit status 2, one line on stderr saying what is wrong, nothing on stdout,
    and no log (nor a log moved aside)."""
    files = _bad_files(tmp_path, media)
    given, projector, expected = BAD[case]
    args = [a.format(**files) for a in given]
    if projector is not None:
        args += ["--mmproj", str(smollm2_path if projector == "model" else projectors[projector])]
    log = tmp_path / "bad.log"
    r = _instr(mm_lib, "run", *args, "-p", "hi", "-n", "2", "-o", str(log), cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""
    assert not log.exists() and not log.with_name("bad.log.old").exists()


def _cli_lines(stderr: str, pattern: str) -> list[float]:
    return [float(m.group(1)) for m in re.finditer(pattern, stderr)]


def _close(printed_ms: float, ns: int) -> bool:
    """llama.cpp's own figure (whole ms, truncated) against the log's: within 5 % or 2 ms."""
    ms = ns / 1e6
    return abs(printed_ms - ms) <= max(0.05 * ms, 2.0)


def _agree(pairs: list[tuple[float, int]]) -> None:
    """llama.cpp's figures against the log's, pair by pair (printed ms, the log's ns). Each figure
    times the same call from outside the log's span, so it is never less than the log's, bar its
    truncation to whole ms; and it is the log's within ``_close`` for all pairs but one at most: a
    pause of the process outside the span lands in llama.cpp's figure alone. At a real-time
    priority the kernel's throttling stops a program that keeps both cores busy for 50 ms of every
    second, wherever in its code that falls (once: 72 ms printed about a step of 28 ms)."""
    for ms, ns in pairs:
        assert ms > ns / 1e6 - 1.0, (ms, ns)
    far = [(ms, ns) for ms, ns in pairs if not _close(ms, ns)]
    assert len(far) <= 1, far


def test_llama_mtmd_cli_figures_are_the_logs(
    mm_lib: Path,
    tools_bin: Path,
    projectors: dict[str, Path],
    vlm_text: Path,
    smollm2_path: Path,
    media: dict[str, Path],
    tmp_path: Path,
) -> None:
    """llama-mtmd-cli at -lv 4 under instr exec (at a real-time priority where it may: see
    ``realtime``), two images of two slices each and a sound, the embeddings decoded 8 at a
    time: each "encoding done in N ms" is an encode's time in the log (its dur and the logger's
    own work in the call), each "decoded (batch i/n) in M ms" a step of that medium's, in order
    (as ``_agree`` compares them); the text is the text of a run with no session."""
    runs = [
        (vlm_text, projectors["idefics3"], ["--image", str(media["test-1.jpeg"])] * 2),
        (smollm2_path, projectors["qwen2a"], ["--audio", str(media["test-2.mp3"])]),
    ]
    for i, (model, mmproj, given) in enumerate(runs):
        argv = ["-m", str(model), "--mmproj", str(mmproj), *given, "-p", "Describe", "-n", "4"]
        argv += ["-t", "2", "--temp", "0", "-b", "8"]
        log = tmp_path / f"cli{i}.log"
        on = _instr(
            mm_lib,
            "exec",
            "-o",
            str(log),
            "llama-mtmd-cli",
            *argv,
            "-lv",
            "4",
            cwd=tmp_path,
            prefix=realtime(),
        )
        assert on.returncode == 0, on.stderr[-3000:]
        off = subprocess.run(
            [str(tools_bin / "llama-mtmd-cli"), *argv],
            capture_output=True,
            text=True,
            timeout=600,
            env=_env(mm_lib),
        )
        assert off.returncode == 0 and off.stdout == on.stdout
        recs = read_log(log)
        printed = _cli_lines(on.stderr, r"encoding done in (\d+) ms")
        encodes = _encodes(recs)
        assert len(printed) == len(encodes) > 0
        _agree([(ms, e["dur"] + e["log_ns"]) for ms, (_, e) in zip(printed, encodes, strict=True)])
        printed = _cli_lines(on.stderr, r"decoded \(batch \d+/\d+\) in (\d+) ms")
        steps = _media_steps(recs)
        assert len(printed) == len(steps) > len(encodes)
        _agree([(ms, e["dur"]) for ms, (_, e) in zip(printed, steps, strict=True)])


HANDLER = r"""
import json, sys
import llama_cpp
from llama_cpp.llama_chat_format import Llava15ChatHandler
import llamacpp_instr

model, mmproj, image, out = sys.argv[1:5]
handler = Llava15ChatHandler(clip_model_path=mmproj, verbose=True)
llm = llama_cpp.Llama(model, chat_handler=handler, n_ctx=2048, n_threads=2, verbose=False)
url = "file://" + image
messages = [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Describe"}]}]
texts = []
for level in (None, "detailed"):
    if level is None:
        r = llm.create_chat_completion(messages=messages, max_tokens=4, temperature=0)
    else:
        with llamacpp_instr.session(llm, out, level=level):
            r = llm.create_chat_completion(messages=messages, max_tokens=4, temperature=0)
    texts.append(r["choices"][0]["message"]["content"])
print(json.dumps(texts))
"""


def test_llama_cpp_pythons_chat_handler_in_a_session(
    mm_lib: Path,
    projectors: dict[str, Path],
    smollm2_path: Path,
    media: dict[str, Path],
    tmp_path: Path,
) -> None:
    """llama-cpp-python's Llava15ChatHandler (an mlp projector) inside llamacpp_instr.session: its
    helper's "image slice encoded in N ms" line is the log's encode; the medium's tokens are
    decoded by steps that name it; the answer is the one it gives with no session."""
    log = tmp_path / "handler.log"
    r = subprocess.run(
        [*realtime(), sys.executable, "-c", HANDLER, str(smollm2_path), str(projectors["mlp"])]
        + [str(media["test-1.jpeg"]), str(log)],
        env=_env(mm_lib),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    off, on = json.loads(r.stdout.strip().splitlines()[-1])
    assert on == off
    recs = read_log(log)
    [m] = by_type(recs, "media")
    encodes = _encodes(recs)
    assert [b["media"] for b, _ in encodes] == [[[m["id"], 0]]]
    # the second call's line (the first ran with no session)
    printed = _cli_lines(r.stderr, r"slice encoded in (\d+) ms")
    assert len(printed) == 2
    [(_, e)] = encodes
    assert _close(printed[1], e["dur"] + e["log_ns"]), (printed, e)
    assert sum(b["n_tokens"] for b, _ in _media_steps(recs)) == m["tokens"] == e["n_tokens"]


def test_timed_ops_cover_each_encode_on_the_cpu(
    mm_lib: Path, smollm2_path: Path, media: dict[str, Path], mm_dir: Path, tmp_path: Path
) -> None:
    """A projector sized like a small real one (6 blocks 256 wide, 512-pixel images: an encode
    of a few hundred ms on 2 cores), two images through instr run (at a real-time priority where
    it may: see ``realtime``): the ops the CPU timed cover at least 0.90 of each encode's time
    (its whole mtmd call: the graph's build and allocation, its inputs and its output's copy are
    the rest)."""
    from helpers.mmproj_gguf import write_vision_mmproj

    mmproj = write_vision_mmproj(
        mm_dir / "gemma3-6x256.gguf",
        projector="gemma3",
        image_size=512,
        n_layer=6,
        n_embd=256,
        n_ff=1024,
    )
    image = str(media["test-1.jpeg"])
    log = tmp_path / "cover.log"
    r = _instr(
        mm_lib,
        "run",
        str(smollm2_path),
        "--mmproj",
        str(mmproj),
        "--image",
        image,
        "--image",
        image,
        "-p",
        "Describe",
        "-n",
        "2",
        "-t",
        "2",
        "-o",
        str(log),
        cwd=tmp_path,
        prefix=realtime(),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    recs = read_log(log)
    ops: dict[tuple[int, int], int] = {}
    for c in by_type(recs, "compute"):
        key = (c["ctx"], c["step"])
        ops[key] = ops.get(key, 0) + sum(o[2] for o in c.get("ops", []))
    encodes = _encodes(recs)
    assert len(encodes) == 2
    for b, e in encodes:
        covered = ops[(e["ctx"], e["step"])] / e["dur"]
        assert covered >= 0.90, (b["first"], covered, e["dur"])


def test_a_projector_whose_compute_buffer_does_not_fit_is_refused_before_it_faults(
    mm_lib: Path,
    projectors: dict[str, Path],
    smollm2_path: Path,
    media: dict[str, Path],
    tmp_path: Path,
) -> None:
    """Under a memory budget that holds the model and the projector's weights but not its
    compute buffer: mtmd loads the projector anyway (its warm-up ignores the failed reservation)
    and would fault at the first encode; instr run ends with the out-of-memory line that names
    the encoder's compute buffer (exit 3) and writes no log. The budget is the bytes a run with
    none held when the encoder's compute buffer was made, plus half of that buffer."""
    sound = str(media["test-2.mp3"])
    common = ["--mmproj", str(projectors["qwen2a"]), "--audio", sound, "-p", "hi", "-n", "2"]
    common += ["--ctx", "1024"]
    free_run = tmp_path / "free.log"
    r = _instr(mm_lib, "run", str(smollm2_path), *common, "-o", str(free_run), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    held = 0
    for rec in read_log(free_run):
        if rec["type"] == "memory_alloc" and rec["device"] == 0:
            if rec["purpose"] == "encoder_compute":
                budget = held + rec["bytes"] // 2
                break
            held += rec["bytes"]
        elif rec["type"] == "memory_free" and rec["device"] == 0:
            held -= rec["bytes"]
    log = tmp_path / "tight.log"
    r = _instr(
        mm_lib,
        "run",
        str(smollm2_path),
        *common,
        "--memory-budget",
        f"CPU={budget}",
        "-o",
        str(log),
        cwd=tmp_path,
    )
    assert r.returncode == 3, (r.returncode, r.stderr[-2000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "encoder_compute needed" in lines[0], r.stderr
    assert not log.exists()
