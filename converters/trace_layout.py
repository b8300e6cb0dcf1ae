"""What a trace shows, independent of the file format: tracks, slices and counter samples.

Both trace writers (Perfetto protobuf, Chrome JSON) render this same stream, so they cannot drift
apart. Layout, per session (one process):

* ``decode steps``: a slice per ``llama_decode`` step (prompt or generation; token ids and text in
  its args), containing a slice per graph compute (ubatch), containing a slice per transformer
  layer, containing a slice per op (with tensor metadata, FLOPs, bytes and achieved rates).
  Ops outside any layer (embedding lookup, final norm, output projection) sit in the compute.
* ``thread N`` (verbose logs): per op, the part of its wall time worker N was busy.
* counters: ``tokens/s``, ``KV cache cells``, ``memory: weights`` / ``KV cache`` / ``compute``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from . import derive
from .session import (
    Compute,
    Event,
    OpTiming,
    SessionEnded,
    SessionInfo,
    SessionStarted,
    Step,
    StepDone,
)


@dataclass(frozen=True)
class Selection:
    """What to include: one layer only, a range of steps, or no ops at all."""

    layer: int | None = None
    steps: tuple[int, int] | None = None  # [first, last) step index
    ops: bool = True

    def wants_step(self, step: Step) -> bool:
        return self.steps is None or self.steps[0] <= step.index < self.steps[1]


@dataclass
class Track:
    uuid: int
    name: str
    parent: int | None  # None: a process track
    kind: str  # "process", "slices" or "counter"
    order: int = 0
    pid: int = 0
    unit: str = ""
    labels: list[str] = field(default_factory=list)  # process tracks: session metadata


@dataclass
class Slice:
    track: int
    name: str
    ts: int
    dur: int
    depth: int
    category: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class Sample:
    track: int
    ts: int
    value: float


Item = Track | Slice | Sample


@dataclass
class LayoutStats:
    steps: int = 0
    computes: int = 0
    layers: int = 0
    ops: int = 0


def track_uuid(*parts: object) -> int:
    """Deterministic 63-bit id: the same log always gives the same trace."""
    h = hashlib.blake2b("\0".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") >> 1 or 1


def _shape(shape: list[int]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _source_text(src: dict[str, Any], op: OpTiming, graph_nodes: list[Any]) -> str:
    if "node" in src:
        n = graph_nodes[src["node"]]
        return f"{n.name} {n.dtype} {_shape(n.shape)}"
    return f"{src['name']} {src['type']} {_shape(src['shape'])} ({src['kind']})"


def op_args(op: OpTiming, compute: Compute) -> dict[str, Any]:
    node = op.node
    graph = compute.graph
    assert graph is not None
    n_flops = derive.flops(node, graph) + sum(derive.flops(f, graph) for f in op.fused)
    n_bytes = derive.bytes_moved(node, graph) + sum(derive.bytes_moved(f, graph) for f in op.fused)
    args: dict[str, Any] = {
        "op": node.label,
        "node": node.name,
        "node_index": node.i,
        "graph": graph.id,
        "layer": node.layer if node.layer is not None else "none",
        "shape": _shape(node.shape),
        "dtype": node.dtype,
        "bytes": node.bytes,
        "sources": "; ".join(_source_text(s, op, graph.nodes) for s in node.src),
        "category": derive.category(node),
        "est_flops": n_flops,
        "est_bytes_moved": n_bytes,
        "gflop_per_s": round(derive.gflops_per_s(n_flops, op.dur), 3),
        "gb_per_s": round(derive.gbytes_per_s(n_bytes, op.dur), 3),
    }
    w = derive.weight_source(node)
    if w is not None:
        args["weight"] = w["name"]
        args["weight_type"] = w["type"]
    if op.fused:
        args["fused"] = ", ".join(f"{f.name} ({f.label})" for f in op.fused)
    if node.flags:
        args["flags"] = ",".join(node.flags)
    if op.stats is not None:
        mn, mx, mean, std, n_nan, n_inf = op.stats
        args.update(
            {
                "out_min": mn,
                "out_max": mx,
                "out_mean": mean,
                "out_std": std,
                "out_nan": n_nan,
                "out_inf": n_inf,
            }
        )
    return args


class _SessionLayout:
    def __init__(self, info: SessionInfo, index: int, sel: Selection) -> None:
        self.info = info
        self.sel = sel
        sid = info.sid
        self.pid = 1000 + index
        self.process = Track(
            track_uuid(sid, "process"), info.title, None, "process", index, self.pid
        )
        self.step_tracks: dict[int, Track] = {}
        self.tok_s = Track(
            track_uuid(sid, "tok/s"),
            "tokens/s",
            self.process.uuid,
            "counter",
            100,
            self.pid,
            "tokens/s",
        )
        self.kv = Track(
            track_uuid(sid, "kv"),
            "KV cache cells",
            self.process.uuid,
            "counter",
            101,
            self.pid,
            "cells",
        )
        self.threads: dict[int, Track] = {}

    def start(self) -> Iterator[Item]:
        info = self.info
        ctx, model = info.context, info.model
        self.process.labels = [
            f"session {info.sid}",
            f"started {info.wall_time}",
            f"level {info.level}",
            f"llama.cpp {info.producer.get('llama_cpp_commit', '?')} patches {info.producer.get('patch_hash', '?')}",
            f"{model.get('architecture', '?')} {model.get('n_layer', '?')} layers, {model.get('file_type', '?')}",
            f"n_ctx {ctx.get('n_ctx', '?')}, {ctx.get('n_threads', '?')} threads, "
            f"flash_attn {ctx.get('flash_attn', '?')}, KV {ctx.get('type_k', '?')}/{ctx.get('type_v', '?')}",
        ]
        if "prompt" in info.metadata:
            self.process.labels.append(f"prompt {str(info.metadata['prompt'])[:120]!r}")
        yield self.process
        yield self.tok_s
        yield self.kv
        mem = self.info.memory
        for k, (key, label) in enumerate(
            [
                ("weights", "memory: weights"),
                ("kv_cache", "memory: KV cache"),
                ("compute", "memory: compute buffers"),
            ]
        ):
            if key in mem:
                t = Track(
                    track_uuid(self.info.sid, "mem", key),
                    label,
                    self.process.uuid,
                    "counter",
                    102 + k,
                    self.pid,
                    "bytes",
                )
                yield t
                yield Sample(t.uuid, self.info.start_ts, float(mem[key]))

    def thread_track(self, t: int) -> Iterator[Item]:
        if t not in self.threads:
            tr = Track(
                track_uuid(self.info.sid, "thread", t),
                f"thread {t}",
                self.process.uuid,
                "slices",
                10 + t,
                self.pid,
            )
            self.threads[t] = tr
            yield tr

    def steps_track(self, ctx: int) -> Iterator[Item]:
        """One steps track per context: two contexts' steps may overlap in time."""
        if ctx not in self.step_tracks:
            name = "decode steps" if ctx <= 1 else f"decode steps (ctx {ctx})"
            tr = Track(
                track_uuid(self.info.sid, "steps", ctx),
                name,
                self.process.uuid,
                "slices",
                ctx,
                self.pid,
            )
            self.step_tracks[ctx] = tr
            yield tr

    def step(self, step: Step, stats: LayoutStats) -> Iterator[Item]:
        if not self.sel.wants_step(step):
            return
        stats.steps += 1
        yield from self.steps_track(step.ctx)
        track = self.step_tracks[step.ctx].uuid
        text = "".join(step.pieces)
        name = f"{step.kind} #{step.index}" + (f" {text!r}" if text and step.kind == "gen" else "")
        args: dict[str, Any] = {
            "step": step.index,
            "kind": step.kind,
            "n_tokens": step.n_tokens,
            "pos": f"{step.pos[0]}..{step.pos[1]}",
            "status": step.status if step.status is not None else "not ended",
            "kv_used": step.kv_used,
            "ended": step.ended,
            "op_time_ns": step.op_time,
        }
        if step.tokens:
            args["token_ids"] = ",".join(map(str, step.tokens[:64]))
            args["text"] = text[:512]
        if step.topk:
            row = step.topk[-1]
            args["top1_id"] = row["ids"][0]
            args["top1_logit"] = row["logits"][0]
        yield Slice(track, name, step.start, step.dur, 0, "step", args)
        if step.dur > 0 and step.ended:
            yield Sample(self.tok_s.uuid, step.end, step.n_tokens / (step.dur / 1e9))
        if step.kv_used >= 0:
            yield Sample(self.kv.uuid, step.end, float(step.kv_used))
        for c in step.computes:
            yield from self.compute(c, track, stats)

    def compute(self, c: Compute, track: int, stats: LayoutStats) -> Iterator[Item]:
        stats.computes += 1
        yield Slice(
            track,
            f"compute ubatch {c.ubatch}",
            c.start,
            c.dur,
            1,
            "compute",
            {
                "ubatch": c.ubatch,
                "graph": c.graph.id if c.graph else -1,
                "n_tokens": c.n_tokens,
                "n_threads": c.n_threads,
            },
        )
        for lay in c.layers:
            if self.sel.layer is not None and lay.layer != self.sel.layer:
                continue
            stats.layers += 1
            yield Slice(
                track,
                f"layer {lay.layer}",
                lay.start,
                lay.dur,
                2,
                "layer",
                {"layer": lay.layer, "n_ops": lay.n_ops},
            )
        if not self.sel.ops or c.graph is None:
            return
        for op in c.ops:
            layer = op.node.layer
            if self.sel.layer is not None and layer != self.sel.layer:
                continue
            stats.ops += 1
            depth = 3 if layer is not None else 2
            yield Slice(track, op.node.label, op.start, op.dur, depth, "op", op_args(op, c))
            if op.thread_done:
                for t, done in enumerate(op.thread_done):
                    if done <= 0:
                        continue  # this worker had no share of the op
                    yield from self.thread_track(t)
                    tr = self.threads[t]
                    yield Slice(
                        tr.uuid,
                        op.node.label,
                        op.start,
                        min(done, op.dur),
                        0,
                        "thread",
                        {"busy_ns": done, "wait_ns": max(0, op.dur - done)},
                    )


def layout(events: Iterator[Event], sel: Selection, stats: LayoutStats) -> Iterator[Item]:
    """Turn session-model events into tracks, slices and samples (streaming)."""
    sessions: dict[str, _SessionLayout] = {}
    for ev in events:
        if isinstance(ev, SessionStarted):
            lay = _SessionLayout(ev.session, len(sessions), sel)
            sessions[ev.session.sid] = lay
            yield from lay.start()
        elif isinstance(ev, StepDone):
            yield from sessions[ev.session.sid].step(ev.step, stats)
        elif isinstance(ev, SessionEnded):
            pass
