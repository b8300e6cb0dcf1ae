"""An encode on an RPC device keeps its own commands: the image's input sent, the graph computed
and the embeddings read back are the encode step's `transfers`, not the next decode step's.

mtmd puts its encoder on the first GPU-type device, and an RPC server is one: `instr run --rpc`
with a projector and an image offloads the encoder (and, with -ngl all, the model) to
ggml-rpc-server (`instr build --tools`'s) on loopback. An encode has no llama context; its
commands are owned by its encoder, and its step's end writes them, so that no decode step takes
them. Before, they carried no owner and the next decode step's end took them (written outside any
step, as "between").

The bytes are checked against the projector's and the model's own shapes (read from their GGUF
files): the image's input is the projector's square of f32 pixels (256 x 256 x 3 x 4 bytes), its
embeddings are (image_size / patch_size / scale_factor) ** 2 tokens of the model's n_embd floats;
and against the wire: a proxy between client and server counts the bytes the server was sent while
each encode ran (the log's clock), which are exactly those of the encode's rows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import gguf
import pytest
from helpers import netsim
from helpers.mmproj_gguf import cached_mmproj, write_vision_mmproj
from helpers.support import by_type, instr, read_log
from helpers.tcp_tap import Wire, tap

pytestmark = pytest.mark.native


def _key(path: Path, name: str) -> int:
    """An integer key of a GGUF file, read with gguf's own reader."""
    field = gguf.GGUFReader(path).fields[name]
    return int(field.parts[field.data[0]][0])


@pytest.fixture(scope="module")
def offloaded_run(
    tools_bin: Path, tiny_llama_f32: Path, media: dict[str, Path], tmp_path_factory: Any
) -> tuple[list[dict[str, Any]], Path, Wire]:
    """`instr run` of the tiny model and a gemma3 projector for it, both on one ggml-rpc-server
    behind a counting proxy, with the same image twice (two encodes, each followed by decodes):
    its records, the projector and what the proxy counted."""
    folder = tmp_path_factory.mktemp("rpc_encode")
    mmproj = cached_mmproj(
        folder, "gemma3-256.gguf", write_vision_mmproj, projector="gemma3", n_embd_text=256
    )
    log = folder / "run.log"
    image = str(media["test-1.jpeg"])
    server = netsim.binary_server_command(tools_bin / "ggml-rpc-server")
    with netsim.Network([(None, 0.0, server)], loopback=True) as net:
        with tap(net.endpoints[0]) as (endpoint, wire):
            r = instr(
                "run", str(tiny_llama_f32), "--ctx", "256", "--mmproj", str(mmproj), "--rpc",
                endpoint, "-ngl", "all", "--image", image, "--image", image, "-p", "hi",
                "-n", "2", "-o", str(log),
            )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return read_log(log), mmproj, wire


def _rows(recs: list[dict[str, Any]]) -> dict[tuple[Any, Any, str], list[list[Any]]]:
    """Every transfer row by (ctx, step, phase) of its record (None, None outside steps), each
    with its queue time on the host clock appended."""
    out: dict[tuple[Any, Any, str], list[list[Any]]] = {}
    for t in by_type(recs, "transfers"):
        key = (t.get("ctx"), t.get("step"), t["phase"])
        out.setdefault(key, []).extend([*row, t["t_start"] + row[6]] for row in t["rows"])
    return out


def test_an_encode_on_an_rpc_device_keeps_its_own_transfers(
    offloaded_run: tuple[list[dict[str, Any]], Path, Wire], tiny_llama_f32: Path
) -> None:
    recs, mmproj, wire = offloaded_run
    devices = by_type(recs, "session_start")[0]["machine"]["devices"]
    (rpc,) = [d["index"] for d in devices if d["backend"] == "RPC"]
    (enc,) = [c["ctx"] for c in by_type(recs, "context") if c.get("role") == "encoder"]
    # the independent figures: the projector's input square and its tokens, the model's width
    side = _key(mmproj, "clip.vision.image_size")
    tokens = (side // _key(mmproj, "clip.vision.patch_size") // 4) ** 2
    input_bytes = side * side * 3 * 4
    embd_bytes = tokens * _key(tiny_llama_f32, "llama.embedding_length") * 4
    assert (input_bytes, embd_bytes) == (786432, 16384)

    begins = {(b["ctx"], b["step"]): b for b in by_type(recs, "step_begin")}
    ends = {(e["ctx"], e["step"]): e for e in by_type(recs, "step_end")}
    encodes = [k for k, b in begins.items() if b["kind"] == "encode"]
    assert len(encodes) == 2 and all(k[0] == enc for k in encodes)
    assert all(m["tokens"] == tokens for m in by_type(recs, "media"))
    rows = _rows(recs)
    rpc_graphs: Counter[tuple[int, int]] = Counter()
    for c in by_type(recs, "compute"):
        splits = [i for i, s in enumerate(c["splits"]) if s[0] == rpc]
        rpc_graphs[(c["ctx"], c["step"])] += len(splits)
        # each compute's remote graphs are its own RPC splits', the encode's too
        assert sorted(r[0] for r in c.get("remote", [])) == splits, c
    for key in encodes:
        e = ends[key]
        mine = rows.get((*key, "step"), [])
        cmds = Counter(row[1] for row in mine)
        # the image's pixels sent, its graph computed, its embeddings read back: nothing else
        # of the model's
        assert [row[3] for row in mine if row[1] == "set_tensor"] == [input_bytes], mine
        assert [row[3] for row in mine if row[1] == "get_tensor"] == [embd_bytes], mine
        assert cmds["graph_compute"] + cmds["graph_recompute"] == rpc_graphs[key] == 1, mine
        assert e["logits"]["bytes"] == embd_bytes
        # issued within the encode's step; the server was sent exactly these bytes meanwhile, and
        # sent back at least their replies (a patched server's op times ride in front of a reply)
        t0, t1 = e["t_start"], e["t_start"] + e["dur"]
        assert all(t0 <= row[-1] <= t1 for row in mine), mine
        assert wire.bytes_in("up", t0, t1) == sum(row[4] for row in mine) > input_bytes
        assert wire.bytes_in("down", t0, t1) >= sum(row[5] for row in mine) > embd_bytes

    # every other record's rows are the model's: no image input, no read but the logits'
    for (ctx, step, phase), theirs in rows.items():
        if (ctx, step) in encodes:
            continue
        assert not [row for row in theirs if "inp_raw" in row[2]], (ctx, step, phase, theirs)
        reads = [row[3] for row in theirs if row[1] == "get_tensor"]
        if phase == "step":
            assert ctx != enc
            cmds = Counter(row[1] for row in theirs)
            assert cmds["graph_compute"] + cmds["graph_recompute"] == rpc_graphs[(ctx, step)]
            assert sum(reads) == ends[(ctx, step)]["logits"]["bytes"], (ctx, step, theirs)
        elif phase == "between":
            assert reads == [], (ctx, step, phase, theirs)
