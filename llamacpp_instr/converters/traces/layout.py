"""What a trace shows, independent of the file format: tracks, slices and counter samples.

Both trace writers (Perfetto protobuf, Chrome JSON) render this same stream, so they cannot drift
apart. Layout, per session (one process):

* ``decode steps``: a slice per ``llama_decode`` step (prompt or generation; token ids and text in
  its args), containing a slice per graph compute (ubatch), containing a slice per transformer
  layer, containing a slice per op (with tensor metadata, FLOPs, bytes and achieved rates).
  Ops outside any layer (embedding lookup, final norm, output projection) sit in the compute.
* ``thread N`` (verbose logs): per op, the part of its wall time worker N was busy.
* counters: ``tokens/s``, ``KV cache cells``, ``memory: weights`` / ``KV cache`` / ``compute``.

``layout_bulk`` yields one item per track, slice and sample, except that each compute comes as
one ``ComputeBatch``: its slice, its layer spans and its op slices as one ``OpBatch`` (the
compute's columns), which the writers encode in bulk; the ops with flows, and those of a compute
with thread timings or tensor statistics (``Compute.per_op``), follow one by one. (A per-op
layout, every op slice its own item, is the tests' reference: tests/reference/.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..reading.decode.columns import LayerSpan
from ..reading.decode.computes import Compute, OpTiming
from ..reading.decode.graphs import Graph, Node
from ..reading.decode.sessions import Event, SessionEnded, SessionInfo, SessionStarted, StepDone
from ..reading.decode.steps import Step
from ..session import derive
from ..session.device_time import multi_device
from ..session.kv_flows import KvFlows, OpFlows
from ..session.machine_peaks import Roof
from ..session.requests import SeqSteps
from .devices import DeviceTracks
from .items import (
    BulkItem,
    ComputeBatch,
    Item,
    LayoutStats,
    OpBatch,
    Sample,
    Selection,
    Slice,
    Track,
    track_uuid,
)
from .rounding import EXACT, round3


def _shape(shape: list[int]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _source_text(src: dict[str, Any], graph_nodes: list[Any]) -> str:
    if "node" in src:
        n = graph_nodes[src["node"]]
        return f"{n.name} {n.dtype} {_shape(n.shape)}"
    return f"{src['name']} {src['type']} {_shape(src['shape'])} ({src['kind']})"


def op_static_args(
    node: Node, fused: list[Node], graph: Graph, roof: Roof | None = None
) -> tuple[dict[str, Any], int, int, dict[str, Any], float | None]:
    """What an op's args say that does not depend on its timing: ``(head, flops, bytes, tail,
    ideal)``.

    An op's args are ``head``, then its rates (``op_rates``: ``gflop_per_s`` and ``gb_per_s``,
    ``flops`` and ``bytes`` over its duration, and with a ``roof``, ``roof_fraction``: ``ideal``,
    its least time at the roofs, over its duration), then ``tail``, then its tensor stats if any
    (see ``op_args``). ``tail`` holds the roofline's intensity (FLOPs per byte) and, with a
    roof, the one that binds it (``bound``: memory or compute). A graph node's static args
    repeat every step, so bulk writers compute them once per node.
    """
    n_flops = derive.flops(node, graph) + sum(derive.flops(f, graph) for f in fused)
    n_bytes = derive.bytes_moved(node, graph) + sum(derive.bytes_moved(f, graph) for f in fused)
    head: dict[str, Any] = {
        "op": node.label,
        "node": node.name,
        "node_index": node.i,
        "graph": graph.id,
        "layer": node.layer if node.layer is not None else "none",
        "shape": _shape(node.shape),
        "dtype": node.dtype,
        "bytes": node.bytes,
        "sources": "; ".join(_source_text(s, graph.nodes) for s in node.src),
        "category": derive.category(node),
        "est_flops": n_flops,
        "est_bytes_moved": n_bytes,
    }
    # the roofline's x (roofline.py): FLOPs per byte moved
    tail: dict[str, Any] = {"intensity": round(n_flops / n_bytes, 3) if n_bytes else 0.0}
    w = derive.weight_source(node)
    ideal = None
    if roof is not None:
        ideal, tail["bound"] = roof.ideal(n_flops, n_bytes, node.op, w["type"] if w else None)
    if w is not None:
        tail["weight"] = w["name"]
        tail["weight_type"] = w["type"]
    if fused:
        tail["fused"] = ", ".join(f"{f.name} ({f.label})" for f in fused)
    if node.flags:
        tail["flags"] = ",".join(node.flags)
    return head, n_flops, n_bytes, tail, ideal


class OpVariants:
    """A bulk writer's id for each op variant of one graph (a node, or a node with the nodes fused
    into it), made by ``build(node index, fused indices)`` on first use. ``ids`` gives a packed
    compute's ops theirs; a generation step repeats its graph's last compute (the same node order
    and fused ops), whose ids come back as they are."""

    def __init__(self, n_nodes: int, build: Callable[[int, tuple[int, ...]], int]) -> None:
        self.build = build
        self.node_id = np.full(n_nodes, -1, dtype=np.int64)
        self.fused_id: dict[tuple[int, tuple[int, ...]], int] = {}
        # the last compute's fused ops, node indices (as bytes) and ids
        self.last: tuple[dict[int, list[int]], bytes, np.ndarray] | None = None

    def ids(self, node: np.ndarray, fused: dict[int, list[int]]) -> np.ndarray:
        """The id of each op: ``node`` its node indices (int64), ``fused`` the fused nodes by op
        position. The result is shared: callers do not change it."""
        key = node.tobytes()
        last = self.last
        if last is not None and (last[0] is fused or last[0] == fused) and last[1] == key:
            return last[2]
        ids = self.node_id[node]
        if (ids < 0).any():
            for i in sorted(set(node[ids < 0].tolist())):  # (np.unique would import numpy.ma)
                self.node_id[i] = self.build(i, ())
            ids = self.node_id[node]
        if fused:
            ids = ids.copy()
            nodes = node.tolist()
            for k, f in fused.items():
                v = (nodes[k], tuple(f))
                r = self.fused_id.get(v)
                if r is None:
                    r = self.fused_id[v] = self.build(*v)
                ids[k] = r
        self.last = (fused, key, ids)
        return ids


RATE_NAMES = ("gflop_per_s", "gb_per_s", "roof_fraction")  # the args ``op_rates`` gives


def op_rates(n_flops: int, n_bytes: int, dur: int, ideal: float | None = None) -> tuple[float, ...]:
    """An op's rates as the args show them (``RATE_NAMES``): ``(gflop_per_s, gb_per_s)``, and
    with a roof's ``ideal`` time, its ``roof_fraction`` (0 without a duration, like the rates)."""
    rates = (
        round(derive.gflops_per_s(n_flops, dur), 3),
        round(derive.gbytes_per_s(n_bytes, dur), 3),
    )
    if ideal is None:
        return rates
    return (*rates, round(ideal / dur, 3) if dur > 0 else 0.0)


def op_rates_bulk(
    flops: np.ndarray,
    nbytes: np.ndarray,
    exact: np.ndarray,
    dur: np.ndarray,
    ideal: np.ndarray | None,
    roofed: np.ndarray,
    one: Callable[[int], tuple[float, ...]],
) -> list[np.ndarray]:
    """``op_rates`` of many ops at once, for the bulk writers: GFLOP/s, GB/s and, if ``ideal`` is
    given (the ops' least times, where ``roofed``), a third array, the roof fraction. ``flops``
    and ``nbytes`` as floats, ``exact`` where they are exact; where numpy cannot be sure of
    Python's rounding (``rounding.round3``), ``one(k)`` gives op k's rates as ``op_rates`` does."""
    pos = dur > 0
    d = np.where(pos, dur, 1).astype(np.float64)
    rates = [round3(np.where(pos, flops / d, 0.0)), round3(np.where(pos, nbytes / d, 0.0))]
    bad = np.isnan(rates[0]) | np.isnan(rates[1]) | ~exact | (dur > EXACT)
    if ideal is not None:
        rates.append(round3(np.where(pos, ideal / d, 0.0)))
        bad |= roofed & np.isnan(rates[2])
    for k in np.flatnonzero(bad).tolist():
        for j, v in enumerate(one(k)):
            rates[j][k] = v
    return rates


def op_args(op: OpTiming, compute: Compute, roof: Roof | None = None) -> dict[str, Any]:
    graph = compute.graph
    assert graph is not None
    args, n_flops, n_bytes, tail, ideal = op_static_args(op.node, op.fused, graph, roof)
    args.update(zip(RATE_NAMES, op_rates(n_flops, n_bytes, op.dur, ideal), strict=False))
    args.update(tail)
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


class SessionLayout:
    """One session's tracks and items."""

    def __init__(
        self,
        info: SessionInfo,
        index: int,
        sel: Selection,
        stats: LayoutStats,
        flows: KvFlows | None = None,
        roof: Roof | None = None,
    ) -> None:
        self.info = info
        self.sel = sel
        self.flows = flows
        self.roof = roof  # the roofs its ops' args are set against (None: no peaks known)
        self.layer_of: dict[Graph, Any] = {}  # each graph's nodes' layers
        self.stats = stats
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
        # served requests (instr serve): lanes of non-overlapping requests, each a track
        self.req_lanes: list[tuple[Track, int]] = []  # (track, end of its last request)
        self.req_done = 0
        # llama-server's requests share batches: each one's steps, for its share (request_share)
        self.seq_steps = SeqSteps()
        # labelled parts (llama-bench's tests), on one track above the requests
        self.parts_track: Track | None = None
        self.parts_done = 0
        # a run on several devices: a track per device, splits, copies, the network
        self.by_device: DeviceTracks | None = None
        if multi_device(info):
            self.by_device = DeviceTracks(self)

    def requests(self) -> Iterator[Item]:
        """Slices for the request records read since the last call. Requests overlap in time
        (they queue for the model), and slices on one track must nest, so each goes on the first
        lane free at its arrival: "requests", "requests (2)", ... above the decode steps. Inside
        each: time to first token, and within it the wait for the model."""
        reqs = self.info.requests
        while self.req_done < len(reqs):
            r = reqs[self.req_done]
            self.req_done += 1
            try:
                t0 = int(r["t_arrive"])
                dur = int(r["dur"] or 0)
            except (KeyError, TypeError, ValueError):
                continue
            lane = next((i for i, (_, end) in enumerate(self.req_lanes) if end <= t0), None)
            if lane is None:
                lane = len(self.req_lanes)
                name = "requests" if lane == 0 else f"requests ({lane + 1})"
                tr = Track(
                    track_uuid(self.info.sid, "requests", lane),
                    name,
                    self.process.uuid,
                    "slices",
                    -100 + lane,  # above the steps tracks (order = context id)
                    self.pid,
                )
                self.req_lanes.append((tr, t0))
                yield tr
            track = self.req_lanes[lane][0]
            self.req_lanes[lane] = (track, t0 + dur)
            args = {
                "id": r.get("id"),
                "endpoint": r.get("endpoint"),
                "status": r.get("status"),
                "stream": bool(r.get("stream")),
                "wait_ms": (r.get("wait") or 0) / 1e6,
                "ttft_ms": (r.get("ttft") or 0) / 1e6 if r.get("ttft") is not None else None,
                "prompt_tokens": r.get("prompt_tokens"),
                "gen_tokens": r.get("gen_tokens"),
            }
            share = self.seq_steps.share(r) if r.get("slot") is not None else None
            if share is not None:  # llama-server: its steps, and its share of shared batches
                args.update(
                    slot=share.slot,
                    steps=share.steps,
                    shared_steps=share.shared_steps,
                    batch_share_ms=share.share_ns / 1e6,
                    steps_ms=share.steps_ns / 1e6,
                )
            name = f"{r.get('method', '')} {r.get('endpoint', '')} {r.get('id', '')}".strip()
            yield Slice(track.uuid, name, t0, dur, 0, "request", args)
            if r.get("ttft") is not None:
                yield Slice(track.uuid, "time to first token", t0, int(r["ttft"]), 1, "request", {})
            if r.get("wait"):
                yield Slice(
                    track.uuid, "waiting for the model", t0, int(r["wait"]), 2, "request", {}
                )
        yield from self.parts()

    def parts(self) -> Iterator[Item]:
        """A slice per `part` record read since the last call, on the "parts" track."""
        parts = self.info.parts
        while self.parts_done < len(parts):
            p = parts[self.parts_done]
            self.parts_done += 1
            try:
                t0, dur = int(p["t_start"]), int(p["dur"])
            except (KeyError, TypeError, ValueError):
                continue
            if self.parts_track is None:
                self.parts_track = Track(
                    track_uuid(self.info.sid, "parts", 0),
                    "parts",
                    self.process.uuid,
                    "slices",
                    -200,  # above the requests
                    self.pid,
                )
                yield self.parts_track
            samples = [int(x) / 1e6 for x in p.get("samples_ns") or []]
            args = {"label": p.get("label"), "program": p.get("program")}
            if samples:
                args["samples_ms"] = ", ".join(f"{x:.3f}" for x in samples)
            yield Slice(self.parts_track.uuid, str(p.get("label")), t0, dur, 0, "part", args)
        if self.by_device is not None:  # RPC commands outside steps (the model's upload first)
            yield from self.by_device.transfers()

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

    def step(self, step: Step, stats: LayoutStats) -> Iterator[BulkItem]:
        self.seq_steps.add(step.start, step.dur, step.n_tokens, step.seqs)
        wanted = self.sel.wants_step(step)
        flows = self.flows.step(self.info.sid, step, wanted) if self.flows is not None else None
        if not wanted:
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
        if step.request is not None:
            args["request"] = step.request
        if step.seqs:
            args["seqs"] = " ".join(f"{q}:{n}@{p0}..{p1}" for q, n, p0, p1 in step.seqs)
        if step.tokens:
            args["token_ids"] = ",".join(map(str, step.tokens[:64]))
            args["text"] = text[:512]
        if step.topk:
            row = step.topk[-1]
            args["top1_id"] = row["ids"][0]
            args["top1_logit"] = row["logits"][0]
        dev = self.by_device
        dur = step.dur
        if dev is not None:  # the step spans what it waited for (an RPC server's compute)
            args["llama_decode_ns"] = step.dur
            dur = dev.step_end(step) - step.start
        yield Slice(track, name, step.start, dur, 0, "step", args)
        if step.dur > 0 and step.ended:
            yield Sample(self.tok_s.uuid, step.end, step.n_tokens / (step.dur / 1e9))
        if step.kv_used >= 0:
            yield Sample(self.kv.uuid, step.end, float(step.kv_used))
        for k, c in enumerate(step.computes):
            if dev is not None:
                yield from dev.compute(c, track, stats, flows[k] if flows else {}, step)
            else:
                yield from self.compute(c, track, stats, flows[k] if flows else {})
        if dev is not None:
            yield from dev.transfers(step)

    def layers(self, graph: Graph) -> Any:
        """The layer of each of the graph's nodes as an array (-1: none)."""
        arr = self.layer_of.get(graph)
        if arr is None:
            arr = np.array([-1 if n.layer is None else n.layer for n in graph.nodes], np.int64)
            self.layer_of[graph] = arr
        return arr

    def compute_slice(self, c: Compute, track: int) -> Slice:
        return Slice(
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

    def spans(self, spans: Sequence[LayerSpan], stats: LayoutStats) -> Sequence[LayerSpan]:
        """The layer spans the selection keeps (counted)."""
        if self.sel.layer is not None:
            spans = [lay for lay in spans if lay.layer == self.sel.layer]
        stats.layers += len(spans)
        return spans

    def compute(
        self, c: Compute, track: int, stats: LayoutStats, flows: OpFlows
    ) -> Iterator[BulkItem]:
        """A compute's slice, layer spans and ops (``part``)."""
        stats.computes += 1
        yield from self.compute_batch(self.compute_slice(c, track), c, c.layers, stats, flows)

    def compute_batch(
        self,
        head: Slice,
        c: Compute,
        spans: Sequence[LayerSpan],
        stats: LayoutStats,
        flows: OpFlows,
        mask: Any = None,
    ) -> Iterator[BulkItem]:
        """A ``ComputeBatch`` (``head``: the compute's slice, or a device's part of it; the layer
        ``spans`` and the compute's ops, those where ``mask`` when it is given, on its track, in
        bulk), then one by one the op slices it does not hold: those with flows, and every op of
        a compute whose ops the bulk writers leave to the per-op view (``Compute.per_op``:
        thread timings, tensor statistics)."""
        track = head.track
        spans = self.spans(spans, stats)
        batch: OpBatch | None = None
        ops: list[tuple[int, OpTiming]] = []
        if self.sel.ops and c.graph is not None and c.per_op:
            ops = [(k, op) for k, op in enumerate(c.unpack()) if mask is None or mask[k]]
        elif self.sel.ops and c.graph is not None:
            keep = None if mask is None else mask.copy()
            if self.sel.layer is not None:
                in_layer = self.layers(c.graph)[c.op_node] == self.sel.layer
                keep = in_layer if keep is None else keep & in_layer
            mine = sorted(k for k in flows if mask is None or mask[k])
            if mine:  # the ops with flows come one by one, as slices with their flows
                if keep is None:
                    keep = np.ones(len(c.op_node), dtype=bool)
                keep[mine] = False
            n = len(c.op_node) if keep is None else int(keep.sum())
            stats.ops += n
            if n:
                batch = OpBatch(track, c, keep, self.roof)
            ops = [(k, c.op_at(k)) for k in mine]
        yield ComputeBatch(head, spans, batch)
        for k, op in ops:
            yield from self.op_slices(k, op, c, track, stats, flows)

    def op_slices(
        self, k: int, op: OpTiming, c: Compute, track: int, stats: LayoutStats, flows: OpFlows
    ) -> Iterator[Item]:
        """The slice of the ``k``-th op of ``c`` (if the selection wants it), and its worker
        threads' slices (verbose logs)."""
        layer = op.node.layer
        if self.sel.layer is not None and layer != self.sel.layer:
            return
        stats.ops += 1
        depth = 3 if layer is not None else 2
        out, into = flows.get(k, ((), ()))
        yield Slice(
            track,
            op.node.label,
            op.start,
            op.dur,
            depth,
            "op",
            op_args(op, c, self.roof),
            out,
            into,
        )
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


def layout_bulk(
    events: Iterator[Event],
    sel: Selection,
    stats: LayoutStats,
    *,
    flows: KvFlows | None = None,
    roofs: Callable[[SessionInfo], Roof | None] | None = None,
) -> Iterator[BulkItem]:
    """Turn session-model events into tracks, slices and samples (streaming), each compute's
    slice, layer spans and packed ops as one ``ComputeBatch``. With ``flows`` (``kv_flows.count``
    over the same events and selection), op slices carry KV-cache flows; with ``roofs``
    (``machine_peaks.session_roofs``), ops carry their roof fraction and bound."""

    def make(info: SessionInfo, k: int) -> SessionLayout:
        return SessionLayout(info, k, sel, stats, flows, roofs(info) if roofs else None)

    return layout_sessions(events, make)


def layout_sessions(
    events: Iterator[Event], make: Callable[[SessionInfo, int], SessionLayout]
) -> Iterator[BulkItem]:
    """The items of every session, ``make(info, index)`` laying out each."""
    sessions: dict[str, SessionLayout] = {}
    for ev in events:
        if isinstance(ev, SessionStarted):
            lay = make(ev.session, len(sessions))
            sessions[ev.session.sid] = lay
            yield from lay.start()
        elif isinstance(ev, StepDone):
            lay = sessions[ev.session.sid]
            yield from lay.requests()
            yield from lay.step(ev.step, lay.stats)
        elif isinstance(ev, SessionEnded):
            yield from sessions[ev.session.sid].requests()
