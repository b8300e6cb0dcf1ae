"""libmtmd in the wheel and llama-mtmd-cli in the tools (`instr build --tools`), driven with the
projectors tests/helpers/mmproj_gguf.py writes: each loads against the bundled SmolLM2, the one
of the wrong width is refused, an image and an audio clip encode to the number of tokens their
shapes give, and llama-mtmd-cli runs an image and an audio file to the end.

The wheel's libraries (those `instr build --no-install` builds and extracts) run in a child
process through LLAMA_CPP_LIB_PATH and MTMD_CPP_LIB, the variable llama_cpp.mtmd_cpp reads, so the
test does not depend on the installed wheel's build; the child is also where a crash in mtmd
would show (a signal, not a failed assertion)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.mmproj_gguf import (
    AUDIO_PROJECTORS,
    SMOLLM2_N_EMBD,
    VISION_PROJECTORS,
    write_audio_mmproj,
)
from helpers.mtmd_input import ON_PATH

pytestmark = pytest.mark.native


def child(lib: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(lib), MTMD_CPP_LIB=str(lib))
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


# importing llama_cpp.mtmd_cpp binds each function it declares with getattr on the library, which
# raises for a symbol the library lacks: the import is the check that every one resolves
IMPORT = r"""
import ctypes, json, re
import llama_cpp.mtmd_cpp as mtmd
bound = [n for n in dir(mtmd) if isinstance(getattr(mtmd, n), ctypes._CFuncPtr)]
maps = open("/proc/self/maps").read()
print(json.dumps({
    "lib": mtmd._libmtmd._name,
    "bound": bound,
    "mapped": sorted(set(re.findall(r"\S*/lib(?:llama|mtmd)\.so\S*", maps))),
}))
"""


def test_the_wheels_libmtmd_loads_beside_its_own_libllama(mm_lib: Path) -> None:
    assert (mm_lib / "libmtmd.so").is_file()
    r = child(mm_lib, IMPORT)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert got["lib"] == str(mm_lib / "libmtmd.so")
    assert len(got["bound"]) > 80
    for name in (
        "mtmd_init_from_file",
        "mtmd_tokenize",
        "mtmd_encode_chunk",
        "mtmd_helper_eval_chunks",
    ):
        assert name in got["bound"]
    # libmtmd's libllama.so.0 is the one the bindings loaded, from the same folder: one of each
    assert got["mapped"] == [str(mm_lib / "libllama.so"), str(mm_lib / "libmtmd.so")]


PROBE = ON_PATH + r"""
import json, sys
import numpy as np
import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
from helpers import mtmd_input

model_path, encode, *paths = sys.argv[1:]
llama_cpp.llama_backend_init()
mparams = llama_cpp.llama_model_default_params()
model = llama_cpp.llama_model_load_from_file(model_path.encode(), mparams)
out = {}
for path in paths:
    params = mtmd.mtmd_context_params_default()
    params.n_threads = 2
    params.warmup = False
    ctx = mtmd.mtmd_init_from_file(path.encode(), model, params)
    if not ctx:
        out[path] = None
        continue
    got = {"vision": mtmd.mtmd_support_vision(ctx), "audio": mtmd.mtmd_support_audio(ctx)}
    if encode == "encode":
        bmp = mtmd_input.medium(mtmd, ctx, 64, 48)
        chunks = mtmd_input.look_chunks(mtmd, ctx, bmp)
        got["media"] = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                continue
            n = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            assert mtmd.mtmd_encode_chunk(ctx, chunk) == 0
            embd = np.ctypeslib.as_array(mtmd.mtmd_get_output_embd(ctx), shape=(n * 576,))
            got["media"].append([n, bool(np.isfinite(embd).all()), float(embd.std())])
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bmp)
    mtmd.mtmd_free(ctx)
    out[path] = got
print(json.dumps(out))
"""


def probe(lib: Path, model: Path, paths: list[Path], encode: bool) -> dict[str, Any]:
    r = child(lib, PROBE, str(model), "encode" if encode else "load", *map(str, paths))
    assert r.returncode == 0, r.stderr[-3000:]
    got: dict[str, Any] = json.loads(r.stdout.splitlines()[-1])
    return got


def test_every_projector_loads_against_smollm2_and_a_wrong_width_is_refused(
    mm_lib: Path, projectors: dict[str, Path], smollm2_path: Path
) -> None:
    got = probe(mm_lib, smollm2_path, list(projectors.values()), encode=False)
    for name in VISION_PROJECTORS:
        assert got[str(projectors[name])] == {"vision": True, "audio": False}, name
    for name in AUDIO_PROJECTORS:
        assert got[str(projectors[name])] == {"vision": False, "audio": True}, name
    # SmolLM2 is 576 wide: mtmd_init_from_file checks the projection's width against it
    assert SMOLLM2_N_EMBD == 576
    assert got[str(projectors["idefics3-512"])] is None


def test_an_image_and_a_clip_encode_to_the_tokens_their_shapes_give(
    mm_lib: Path, projectors: dict[str, Path], vlm_text: Path
) -> None:
    names = [*VISION_PROJECTORS, "qwen2a", "ultravox"]
    got = probe(mm_lib, vlm_text, [projectors[n] for n in names], encode=True)
    tokens = {n: [m[0] for m in got[str(projectors[n])]["media"]] for n in names}
    # 256 px images of 16 px patches: 16 x 16 patches; idefics3 folds 4 x 4 of them into one token
    # and encodes the overview and one tile (the preprocessor's longest edge is the image size),
    # gemma3 pools 4 x 4, LLaVA's MLP keeps each patch
    assert tokens["idefics3"] == [16, 16]
    assert tokens["gemma3"] == [16]
    assert tokens["mlp"] == tokens["mlp_norm"] == [256]
    # MobileVLM's: 96 px of 4 px patches, 24 x 24, halved a side by the stride-2 block (ldp) or
    # the pool of 2 (ldpv2); GLM-Edge's stride-2 convolution, and its begin and end embeddings
    assert tokens["ldp"] == tokens["ldpv2"] == [12 * 12]
    assert tokens["adapter"] == [8 * 8 + 2]
    # 1 s is padded to whisper's 30 s: 3000 mel frames, 1500 after the stride-2 convolution;
    # Qwen2-Audio pools them by 2, ultravox stacks 4
    assert tokens["qwen2a"] == [750]
    assert tokens["ultravox"] == [375]
    for n in names:
        for _, finite, std in got[str(projectors[n])]["media"]:
            assert finite and std > 0, n


CHAT = r"""
import base64, json, sys
import llama_cpp
from llama_cpp.llama_chat_format import Llava15ChatHandler

model, mmproj, image = sys.argv[1:4]
handler = Llava15ChatHandler(clip_model_path=mmproj, verbose=False)
llm = llama_cpp.Llama(model, chat_handler=handler, n_ctx=1024, n_threads=2, verbose=False)
uri = "data:image/jpeg;base64," + base64.b64encode(open(image, "rb").read()).decode()
system, question = "You see images.", "What is in the image?"
prompt_tokens = {}
for name, parts in (("text", []), ("image", [{"type": "image_url", "image_url": {"url": uri}}])):
    user = {"role": "user", "content": parts + [{"type": "text", "text": question}]}
    messages = [{"role": "system", "content": system}, user]
    r = llm.create_chat_completion(messages=messages, max_tokens=2, temperature=0)
    assert isinstance(r["choices"][0]["message"]["content"], str)
    prompt_tokens[name] = r["usage"]["prompt_tokens"]
# Llava15ChatHandler's template puts the image between "USER: " and the question: the text is
# tokenized in two pieces around it, which can take a token more than in one
tok = lambda s, bos: len(llm.tokenize(s.encode(), add_bos=bos, special=True))
before, after = system + "\nUSER: ", question + "\nASSISTANT: "
split = tok(before, True) + tok(after, False) - tok(before + after, True)
print(json.dumps({"tokens": prompt_tokens, "split": split}))
del llm
"""


def test_llava15_chat_handler_puts_an_image_in_the_prompt(
    mm_lib: Path, smollm2_path: Path, projectors: dict[str, Path], media: dict[str, Path]
) -> None:
    r = child(mm_lib, CHAT, str(smollm2_path), str(projectors["mlp"]), str(media["test-1.jpeg"]))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    # LLaVA's MLP keeps each of the 256 patches of a 256 px image of 16 px patches
    assert got["tokens"]["image"] - got["tokens"]["text"] == 256 + got["split"]


def mtmd_cli(
    tools_bin: Path, model: Path, mmproj: Path, *media: str, log: Path | None = None
) -> str:
    """llama-mtmd-cli run to the end on ``media`` (--image/--audio FILE), 2 tokens greedy, with a
    session open (`instr exec -o LOG`) when ``log`` is given; its log (-v: mtmd's helper logs each
    media chunk it decodes into the text model)."""
    cmd = [str(tools_bin / "llama-mtmd-cli")]
    if log is not None:
        cmd = [sys.executable, "-m", "llamacpp_instr.cli", "exec", "-o", str(log), "llama-mtmd-cli"]
    cmd += ["-m", str(model), "--mmproj", str(mmproj), *media]
    cmd += ["-p", "What is this?", "-n", "2", "--temp", "0", "-t", "2", "-c", "2048", "-v"]
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stderr


def test_llama_mtmd_cli_runs_an_image_through_smolvlms_projector_in_a_session(
    tools_bin: Path,
    vlm_text: Path,
    projectors: dict[str, Path],
    media: dict[str, Path],
    mm_dir: Path,
) -> None:
    log = mm_dir / "mtmd-cli.log"
    out = mtmd_cli(
        tools_bin, vlm_text, projectors["idefics3"], "--image", str(media["test-1.jpeg"]), log=log
    )
    # the overview and one tile, each encoded (a batch of its own: text lies between them) and
    # decoded into the text model
    assert len(re.findall(r"mtmd batch encoding done in \d+ ms", out)) == 2
    assert len(re.findall(r"image decoded \(batch 1/1\) in \d+ ms", out)) == 2
    # the session log holds them as two encodes and the two steps of their embeddings (no token
    # ids), 16 positions each, between the text steps that carry SmolVLM's image tokens
    recs = [json.loads(line) for line in log.open(encoding="utf-8")]
    assert recs[-1]["type"] == "session_end" and recs[-1]["status"] == "ok"
    steps = [r for r in recs if r["type"] == "step_begin"]
    assert [s["n_tokens"] for s in steps if s["kind"] == "encode"] == [16, 16]
    assert [s["n_tokens"] for s in steps if "tokens" not in s and s["kind"] != "encode"] == [16, 16]
    pieces = [p for s in steps for p in s.get("pieces", [])]
    assert pieces.count("<global-img>") == 1 and pieces.count("<fake_token_around_image>") == 3


def test_llama_mtmd_cli_runs_an_audio_file_through_a_whisper_projector(
    tools_bin: Path, smollm2_path: Path, mm_dir: Path, media: dict[str, Path]
) -> None:
    # ultravox stacking 10 frames: 150 tokens for SmolLM2 to decode, where Qwen2-Audio's 750 take
    # five times as long
    mmproj = write_audio_mmproj(mm_dir / "ultravox-10.gguf", projector="ultravox", stack_factor=10)
    log = mtmd_cli(tools_bin, smollm2_path, mmproj, "--audio", str(media["test-2.mp3"]))
    assert "audio_tokens->n_tokens = 150" in log
    assert len(re.findall(r"mtmd batch encoding done in \d+ ms", log)) == 1
    assert len(re.findall(r"audio decoded \(batch 1/1\) in \d+ ms", log)) == 1
