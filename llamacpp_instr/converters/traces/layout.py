"""What a trace shows, independent of the file format: tracks, slices and counter samples.

Both trace writers (Perfetto protobuf, Chrome JSON) render this same stream, so they cannot drift
apart. Layout, per session (one process):

* ``decode steps``: a slice per ``llama_decode`` step (prompt or generation; token ids and text in
  its args), containing a slice per graph compute (ubatch), containing a slice per transformer
  layer, containing a slice per op (with tensor metadata, FLOPs, bytes and achieved rates).
  Ops outside any layer (embedding lookup, final norm, output projection) sit in the compute.
* ``encoder ...``: an image or sound encoder's context (tools/mtmd), a slice per encode laid out
  as a decode step is (its blocks are layers, its projector layer n_layer), with a flow to the
  decode steps that carry its embeddings; ``media``: each image's or sound's load and
  preprocessing (``media_tracks``).
* ``slot N: sampling`` under each context's steps track: the host's work between its steps, per
  slot (``host_tracks``).
* ``thread N`` (verbose logs): per op, the part of its wall time worker N was busy.
* counters: ``tokens/s``, ``KV cache cells``, ``memory: weights`` / ``KV cache`` / ``compute``
  (``counter_tracks``); a mixture of experts' ``experts used: layer N`` (``expert_tracks``).

``layout_bulk`` yields one item per track, slice and sample, except that each compute comes as
one ``ComputeBatch``: its slice, its layer spans and its op slices as one ``OpBatch`` (the
compute's columns), which the writers encode in bulk; the ops with flows, and those of a compute
with thread timings or tensor statistics (``Compute.per_op``), follow one by one. (A per-op
layout, every op slice its own item, is the tests' reference: tests/reference/.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ..reading.decode.media import Encode
from ..reading.decode.passes import Pass
from ..reading.decode.sessions import (
    EncodeDone,
    Event,
    HostDone,
    SessionEnded,
    SessionInfo,
    SessionStarted,
    StepDone,
)
from ..reading.decode.steps import Step
from ..session.device_time import multi_device
from ..session.kv_flows import KvFlows, OpFlows
from ..session.machine_peaks import Roof
from .counter_tracks import CounterTracks
from .device_tracks import DeviceTracks
from .expert_tracks import ExpertTracks
from .host_tracks import HostTracks
from .items import (
    BulkItem,
    Item,
    LayoutStats,
    Selection,
    Slice,
    SliceRows,
    Track,
    track_uuid,
)
from .layout_ops import OpsLayout
from .media_tracks import (
    MediaTracks,
    encode_args,
    encode_name,
    encoder_track_name,
    modality,
    step_flows,
)
from .memory_tracks import MemoryTracks
from .served import ServedTracks


class SessionLayout(OpsLayout):
    """One session's tracks and items: its process, steps and counter tracks, and the steps on
    them; computes as ``OpsLayout`` lays them out, requests and parts as ``ServedTracks`` does,
    and on several devices, the device tracks (``DeviceTracks``)."""

    def __init__(
        self,
        info: SessionInfo,
        index: int,
        sel: Selection,
        stats: LayoutStats,
        flows: KvFlows | None = None,
        roof: Roof | None = None,
        bulk: bool = False,
    ) -> None:
        sid = info.sid
        # the device slices in bulk (``SliceRows``), as the writers take them; else one by one
        self.bulk = bulk
        pid = 1000 + index
        process = Track(track_uuid(sid, "process"), info.title, None, "process", index, pid)
        super().__init__(info, process, sel, roof)
        self.flows = flows
        self.stats = stats
        self.step_tracks: dict[int, Track] = {}
        self.counters = CounterTracks(info, self.process)
        self.served = ServedTracks(info, self.process)
        self.host_work = HostTracks(sid, pid)
        self.memory = MemoryTracks(info, self.process)
        self.media = MediaTracks(info, self.process)
        self.experts = ExpertTracks(sid, self.process, sel.layer)
        # a run on several devices: a track per device, splits, copies, the network
        self.by_device: DeviceTracks | None = None
        if multi_device(info):
            self.by_device = DeviceTracks(self)

    def requests(self) -> Iterator[Item | SliceRows]:
        """Slices for the request and part records read since the last call (``ServedTracks``),
        then on several devices the RPC commands sent outside steps (the model's upload first)."""
        # (each asked first: nearly every step reads none of these)
        if self.served.pending():
            yield from self.served.items()
        if self.memory.pending():
            yield from self.memory.items()
        if self.media.pending():
            yield from self.media.items()
        if self.by_device is not None and self.by_device.network.pending():
            yield from self.by_device.transfers()

    def start(self) -> Iterator[Item]:
        """The session's process track (described: ``process_labels``) and its counters."""
        self.process.labels = process_labels(self.info)
        yield self.process
        yield from self.counters.start()

    def steps_track(self, ctx: int, encoder: bool = False) -> Iterator[Item]:
        """One steps track per context: two contexts' steps may overlap in time; an encoder's
        (its encodes) says so."""
        if ctx not in self.step_tracks:
            name = "decode steps" if ctx <= 1 else f"decode steps (ctx {ctx})"
            if encoder:
                name = encoder_track_name(self.info, ctx)
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
        """A decode step: its sequences' share (requests), its slice, tokens/s, and its work."""
        self.served.seq_steps.add(step.start, step.dur, step.n_tokens, step.seqs)
        wanted = self.sel.wants_step(step)
        flows = self.flows.step(self.info.sid, step, wanted) if self.flows is not None else None
        if not wanted:
            return
        name, args = decode_slice(step)
        yield from self.pass_slice(step, stats, name, args, step_flows(self.info.sid, step), False)
        yield from self.counters.tokens_per_s(step)
        yield from self.pass_work(step, stats, flows)

    def encode(self, enc: Encode, stats: LayoutStats) -> Iterator[BulkItem]:
        """An encoder's encode, on its encoder's track (``media_tracks``), laid out as a step
        is: no sequence's, no token's, no KV cache's."""
        if not self.sel.wants_step(enc):
            return
        name = encode_name(enc, modality(self.info, enc.ctx) or "media")
        yield from self.pass_slice(
            enc, stats, name, encode_args(enc), step_flows(self.info.sid, enc), True
        )
        yield from self.pass_work(enc, stats, None)

    def pass_slice(
        self,
        p: Pass,
        stats: LayoutStats,
        name: str,
        args: dict[str, Any],
        media_flows: tuple[int, ...],
        encoder: bool,
    ) -> Iterator[Item]:
        """A pass's slice on its context's steps track (made at its first pass; ``encoder``:
        named for an encoder), spanning what it waited for on several devices, with the media
        flows it starts (an encode's) or carries (a decode step's)."""
        stats.steps += 1
        yield from self.steps_track(p.ctx, encoder)
        track = self.step_tracks[p.ctx].uuid
        dur = p.dur
        if self.by_device is not None:  # (an RPC server's compute)
            args["llama_decode_ns"] = p.dur
            dur = self.by_device.step_end(p) - p.start
        yield Slice(track, name, p.start, dur, 0, "step", args, media_flows, carries=not encoder)

    def pass_work(
        self, p: Pass, stats: LayoutStats, flows: list[OpFlows] | None
    ) -> Iterator[BulkItem]:
        """What a pass holds, after its slice: the KV cells used, its computes (with their
        KV-cache ``flows``, if any), its RPC commands and its experts' routing."""
        yield from self.counters.kv_used(p)
        track = self.step_tracks[p.ctx].uuid
        dev = self.by_device
        for k, c in enumerate(p.computes):
            if dev is not None:
                yield from dev.compute(c, track, stats, flows[k] if flows else {}, p)
            else:
                yield from self.compute(c, track, stats, flows[k] if flows else {})
        if dev is not None:
            yield from dev.transfers(p)
        if p.experts:
            yield from self.experts.step(p)


def process_labels(info: SessionInfo) -> list[str]:
    """What a session's process track says of it: the session, its build, model and context."""
    ctx, model = info.context, info.model
    labels = [
        f"session {info.sid}",
        f"started {info.wall_time}",
        f"level {info.level}",
        f"llama.cpp {info.producer.get('llama_cpp_commit', '?')} patches {info.producer.get('patch_hash', '?')}",
        f"{model.get('architecture', '?')} {model.get('n_layer', '?')} layers, {model.get('file_type', '?')}",
        f"n_ctx {ctx.get('n_ctx', '?')}, {ctx.get('n_threads', '?')} threads, "
        f"flash_attn {ctx.get('flash_attn', '?')}, KV {ctx.get('type_k', '?')}/{ctx.get('type_v', '?')}",
    ]
    if "prompt" in info.metadata:
        labels.append(f"prompt {str(info.metadata['prompt'])[:120]!r}")
    return labels


def decode_slice(step: Step) -> tuple[str, dict[str, Any]]:
    """A decode step's slice: its name and args."""
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
    if step.media:
        args["media"] = " ".join(f"{m}:{k}" for m, k in step.media)
    return name, args


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
        stats.sessions += 1
        return SessionLayout(info, k, sel, stats, flows, roofs(info) if roofs else None, True)

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
        elif isinstance(ev, EncodeDone):
            lay = sessions[ev.session.sid]
            yield from lay.requests()
            yield from lay.encode(ev.encode, lay.stats)
        elif isinstance(ev, HostDone):
            lay = sessions[ev.session.sid]
            yield from lay.steps_track(ev.host.ctx)
            yield from lay.host_work.items(ev.host, lay.step_tracks[ev.host.ctx].uuid)
        elif isinstance(ev, SessionEnded):
            yield from sessions[ev.session.sid].requests()
