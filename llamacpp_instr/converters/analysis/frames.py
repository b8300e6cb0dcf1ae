"""The analysis API: a session log as pandas DataFrames.

    from . import load_session
    s = load_session("session.log")
    s.ops.groupby("label", observed=True)["dur_ns"].sum().sort_values()

Tables (integer nanosecond timestamps and durations; names, ops and types are categoricals):

* ``steps`` — one row per ``llama_decode``: step, ctx, kind, n_tokens, pos0, pos1, t_start, dur_ns
  (until its outputs were ready: ``step_times.ready_at``; later than llama_decode's return where an
  RPC server computed the step's last graph), status, n_outputs, kv_used, op_ns (sum of its op
  durations), ended, request, level (what it was recorded at: with sampling, minimal steps have no
  op times), llama_decode_ns (the time in llama_decode itself); weight_bytes and kv_bytes
  (read by its graphs), and with peaks ideal_ns, roof_frac and roof (memory for generation, compute
  for prompt steps); role (its context's, target or draft, where the log says: llama-server's
  speculative decoding, ``frames_spec``).
* ``layers`` — one row per layer span per compute: step, ubatch, layer, t_start, dur_ns, n_ops.
* ``ops`` — one row per timed op per compute, with its node's metadata joined: step, ubatch, graph,
  node, name, op, label, category, layer, t_start, dur_ns, n_fused, shape, dtype, weight,
  weight_type, est_flops, est_bytes; the roofline (``roofline.py``): intensity (FLOPs/byte),
  gflops_s, gbs (achieved), and, when ``peaks_cache`` holds peaks for the machine that made the
  log (``instr peaks``; NaN otherwise), ideal_ns (the least time at the roofs), roof_frac, bound.
* ``nodes`` — the graph tables: graph, node, name, op, label, layer, shape, dtype, bytes, flags.
* ``weights`` — the weight inventory of session_start.
* ``requests`` — served requests (``request`` records), with llama-server's speculation as the
  server counted it (spec_type, spec_drafted, spec_accepted, spec_verify_steps, spec_draft_ns,
  spec_verify_ns, spec_rejected_ns; null without).
* ``contexts``, ``spec`` (a speculating llama-server) — each context's model and role, and each
  verify step of a slot (``frames_spec``).
* ``tensor_stats`` (verbose) — step, ubatch, node, name, min, max, mean, std, n_nan, n_inf.
* ``topk`` (verbose) — step, row, rank, token, logit.
* ``samplers``, ``host``, ``host_seqs``, ``chains``, ``context_perf`` — the host's work between
  steps: each sampler of the chain, the grammar, the program's own work, per step and sequence,
  with llama.cpp's own counters beside (``frames_host``).
* ``experts`` (a mixture of experts at detailed, on the CPU) — step, layer, expert, tokens,
  weight (the sum of the tokens' routing weights; NaN where not read), ubatch. Where a step's
  routing is recorded, a MUL_MAT_ID op's est_bytes counts only the experts its ubatch routed to
  (``ops.expert_bytes`` "routed"); elsewhere the whole expert tensor ("all experts").

Built in one streaming pass over the session model's steps (``session.fold.iter_events_packed``:
the one decoder, so the same steps and the same skipped records as every other reader), with no
Python object per op (the ops table: ``frames_ops``). Categorical columns keep their categories
in order of first appearance (``columns``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from llamacpp_instr.contract.errors import UserError

from ..reading import prefetch
from ..reading.decode.graphs import Graph
from ..reading.decode.media import Encode
from ..reading.decode.memory import StepMemory
from ..reading.decode.passes import Pass
from ..reading.decode.sessions import EncodeDone, HostDone, SessionInfo, SessionStarted, StepDone
from ..reading.decode.steps import Step
from ..reading.reader import ReadReport
from ..session import machine_peaks
from ..session.device_time import multi_device
from ..session.fold import iter_events_packed
from ..session.step_times import ready_at
from . import roofline
from .frames_devices import TABLES as DEVICE_TABLES
from .frames_devices import DeviceBuilder
from .frames_host import HostBuilder
from .frames_media import EncodeRows, media_frame
from .frames_ops import ComputeColumns, LayersBuilder, OpsBuilder
from .frames_spec import contexts_frame, request_spec_columns, verify_frame
from .frames_steps import StepTables
from .heap import older_objects_frozen
from .memory_frames import allocations_frame, memory_frame
from .table_columns import Table, shape_text, string_categories


@dataclass
class SessionFrames:
    """One session's tables (see the module docstring)."""

    info: SessionInfo
    steps: pd.DataFrame
    layers: pd.DataFrame
    ops: pd.DataFrame
    nodes: pd.DataFrame
    weights: pd.DataFrame
    tensor_stats: pd.DataFrame
    topk: pd.DataFrame
    seqs: pd.DataFrame = field(default_factory=pd.DataFrame)
    requests: pd.DataFrame = field(default_factory=pd.DataFrame)
    graphs: dict[int, Graph] = field(default_factory=dict)  # the node tables, with their sources
    report: ReadReport = field(default_factory=ReadReport)
    # the peaks of the machine that made the log (roofline.py), or why there are none
    peaks: Any = None
    peaks_note: str = ""
    # the tokens the run fed back while generating (its own choices), in step order
    generated_tokens: list[int] = field(default_factory=list)
    # a run on several devices (``frames_devices``; empty for a CPU-only log)
    devices: pd.DataFrame = field(default_factory=pd.DataFrame)
    splits: pd.DataFrame = field(default_factory=pd.DataFrame)
    copies: pd.DataFrame = field(default_factory=pd.DataFrame)
    busy: pd.DataFrame = field(default_factory=pd.DataFrame)
    remote: pd.DataFrame = field(default_factory=pd.DataFrame)
    transfers: pd.DataFrame = field(default_factory=pd.DataFrame)
    device_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    token_time: pd.DataFrame = field(default_factory=pd.DataFrame)
    # memory (``memory_frames``; empty for a log from before memory was recorded), and each
    # step's figures as read (``session.memory_timeline``)
    allocations: pd.DataFrame = field(default_factory=pd.DataFrame)
    memory: pd.DataFrame = field(default_factory=pd.DataFrame)
    step_memory: list[StepMemory] = field(default_factory=list)
    # a mixture of experts' routing (``experts`` records; empty without them)
    experts: pd.DataFrame = field(default_factory=pd.DataFrame)
    # speculative decoding (``frames_spec``; empty without it)
    contexts: pd.DataFrame = field(default_factory=pd.DataFrame)
    spec: pd.DataFrame = field(default_factory=pd.DataFrame)
    # the host's work between steps: each sampler, the grammar, the program's own work
    # (``frames_host``; empty in logs from before it was recorded)
    samplers: pd.DataFrame = field(default_factory=pd.DataFrame)
    host: pd.DataFrame = field(default_factory=pd.DataFrame)
    host_seqs: pd.DataFrame = field(default_factory=pd.DataFrame)
    chains: pd.DataFrame = field(default_factory=pd.DataFrame)
    context_perf: pd.DataFrame = field(default_factory=pd.DataFrame)
    # images and sounds: the media, the encoders' encodes, their layer spans and ops
    # (``frames_media``; empty without them)
    media: pd.DataFrame = field(default_factory=pd.DataFrame)
    encodes: pd.DataFrame = field(default_factory=pd.DataFrame)
    encode_media: pd.DataFrame = field(default_factory=pd.DataFrame)
    encode_layers: pd.DataFrame = field(default_factory=pd.DataFrame)
    encode_ops: pd.DataFrame = field(default_factory=pd.DataFrame)

    TABLES = (
        "steps",
        "layers",
        "ops",
        "nodes",
        "weights",
        "tensor_stats",
        "topk",
        "seqs",
        "requests",
        "experts",
        "samplers",
        "host",
        "host_seqs",
        "chains",
        "context_perf",
    )
    MEDIA_TABLES = ("media", "encodes", "encode_media", "encode_layers", "encode_ops")

    def tables(self) -> dict[str, pd.DataFrame]:
        """The tables (with the device tables of a run on several devices, the media tables of
        a run with images or sounds)."""
        names = self.TABLES + (DEVICE_TABLES if not self.devices.empty else ())
        names += self.MEDIA_TABLES if not (self.media.empty and self.encodes.empty) else ()
        names += ("allocations", "memory") if not self.allocations.empty else ()
        names += ("contexts", "spec") if not (self.contexts.empty and self.spec.empty) else ()
        return {name: getattr(self, name) for name in names}

    def sampling(self) -> Sampling:
        """What was recorded at which level (``Sampling``): per-op figures come from the
        ``timed_steps`` only."""
        return Sampling.of(self)


@dataclass
class Sampling:
    """Which steps of a session carry op times. A sampled log (``--sample``, ``--sample-requests``)
    records some steps at its level and the others at minimal; a log whose level was changed
    while it ran mixes levels too. Per-op figures (time per op type, op-time coverage) come from
    the steps recorded at detailed or above, and say so."""

    level: str  # the session's
    sample_steps: int  # one step in N (1: every step)
    sample_requests: int  # the steps of one request in N (1: every request)
    steps_by_level: dict[str, int]  # steps recorded at each level
    timed_steps: int  # steps recorded at detailed or above (with op times)
    steps: int

    @classmethod
    def of(cls, f: SessionFrames) -> Sampling:
        from llamacpp_instr.contract.schema import level_at_least

        levels = f.steps["level"].astype(str).value_counts() if len(f.steps) else pd.Series()
        by_level = {str(k): int(v) for k, v in levels.items()}
        timed = sum(n for lv, n in by_level.items() if level_at_least(lv, "detailed"))
        return cls(
            level=f.info.level,
            sample_steps=int(f.info.sample.get("steps", 1) or 1),
            sample_requests=int(f.info.sample.get("requests", 1) or 1),
            steps_by_level=by_level,
            timed_steps=timed,
            steps=len(f.steps),
        )

    @property
    def mixed(self) -> bool:
        """Are the steps recorded at more than one level?"""
        return len(self.steps_by_level) > 1

    def describe(self) -> str:
        """One line: "1 step in 16 at detailed (63 of 1000 steps with op times)"; "" when every
        step is recorded at the session's level."""
        if not self.mixed and self.sample_steps == 1 and self.sample_requests == 1:
            return ""
        how = []
        if self.sample_steps > 1:
            how.append(f"1 step in {self.sample_steps}")
        if self.sample_requests > 1:
            how.append(f"the steps of 1 request in {self.sample_requests}")
        what = (" and ".join(how) + f" at {self.level}") if how else "levels changed during the run"
        return f"{what} ({self.timed_steps} of {self.steps} steps with op times)"


class _Builder:
    NODE_COLS = "graph node name op label layer shape dtype bytes flags".split()
    STAT_COLS = "step ubatch node name min max mean std n_nan n_inf".split()
    EXPERT_COLS = "step layer expert tokens weight ubatch".split()

    def __init__(self, info: SessionInfo) -> None:
        self.info = info
        self.steps = StepTables(info)  # the decode steps' own rows
        self.memory_rows: list[tuple[int, int, int, StepMemory]] = []
        self.nodes = Table(
            "graph node layer bytes", cats="name op label shape dtype flags", nullable="layer"
        )
        self.stats = Table("step ubatch node n_nan n_inf", "min max mean std", cats="name")
        # per routing record: step, ubatch, its rows (layer, expert, tokens) and their weights
        self.expert_parts: list[tuple[int, int, np.ndarray, np.ndarray]] = []
        self.n_expert = 0  # the routing records' experts per layer
        self.graphs: dict[int, Graph] = {}
        self.layers = LayersBuilder()
        self.ops = OpsBuilder()  # the ops table, joined with per-node columns at the end
        # an encoder's encodes: tables of their own (``frames_media``)
        self.encodes = EncodeRows(info)
        self.encode_layers = LayersBuilder()
        self.encode_ops = OpsBuilder()
        self.dev = DeviceBuilder(info) if multi_device(info) else None  # several devices
        self.host = HostBuilder()  # the host's work between steps

    def step(self, s: Step) -> None:
        """A decode step: its rows of ``steps``, ``seqs`` and ``topk``, its computes into
        ``layers`` and ``ops``, and on several devices the device tables."""
        cols, op_ns = self.columns(s)
        self.steps.add(s, op_ns)
        self.computes(s, cols, self.layers, self.ops, self.dev)
        if self.dev is not None:
            self.dev.step(s)

    def encode(self, e: Encode) -> None:
        """An encoder's encode: its row of ``encodes`` (``frames_media``), its computes into
        ``encode_layers`` and ``encode_ops`` (the device tables are the decode steps')."""
        cols, op_ns = self.columns(e)
        self.encodes.add(e, ready_at(e) - e.start, op_ns)
        self.computes(e, cols, self.encode_layers, self.encode_ops, None)

    @staticmethod
    def columns(p: Pass) -> tuple[list[ComputeColumns], int]:
        """A pass's computes as columns, and the time of its timed ops."""
        cols = [ComputeColumns(c) for c in p.computes]
        op_ns = 0
        for cc in cols:
            if cc.ops.shape[1]:
                op_ns += int(cc.ops[2].sum())
        return cols, op_ns

    def computes(
        self,
        s: Pass,
        cols: list[ComputeColumns],
        layers: LayersBuilder,
        ops: OpsBuilder,
        dev: DeviceBuilder | None,
    ) -> None:
        """What any pass holds, into ``layers`` and ``ops`` (a decode step's tables, or an
        encode's) and the tables every pass shares: its memory, its graphs' nodes, its tensors'
        statistics, its experts' routing; ``dev``: the device tables (a decode step's)."""
        if s.memory is not None:
            self.memory_rows.append((s.index, s.ctx, s.end, s.memory))
        for c, cc in zip(s.computes, cols, strict=True):
            g = c.graph
            has_ops = g is not None and cc.ops.shape[1] > 0
            ubatch = -1  # converted only for the layer and op rows, the rows that show it
            if len(cc.layers) or has_ops:
                ubatch = -1 if c.ubatch is None else int(c.ubatch)
            if len(cc.layers):
                layers.add(s.index, ubatch, cc.layers)
                if dev is not None:
                    dev.layers(c)
            if g is None:
                continue
            if g.id not in self.graphs:
                self.graphs[g.id] = g
                for n in g.nodes:
                    self.nodes.add(
                        graph=g.id, node=n.i, name=n.name, op=n.op, label=n.label, layer=n.layer,
                        shape=shape_text(n.shape), dtype=n.dtype, bytes=n.bytes, flags=",".join(n.flags),
                    )  # fmt: skip
            if not has_ops:
                continue
            ops.add(s.index, ubatch, g, cc)
            if dev is not None:
                dev.ops(c)
            for k, (mn, mx, mean, std, n_nan, n_inf) in cc.stats:
                n = g.nodes[int(cc.ops[0, k])]
                self.stats.add(
                    step=s.index, ubatch=ubatch, node=n.i, name=n.name, min=mn, max=mx,
                    mean=mean, std=std, n_nan=n_nan, n_inf=n_inf,
                )  # fmt: skip
        for r in s.experts:
            self.n_expert = max(self.n_expert, r.n_expert)
            self.expert_parts.append((s.index, r.ubatch, r.rows, r.weight))
            ops.route(s.index, r)

    def frames(self, report: ReadReport, peaks_cache: Path | None) -> SessionFrames:
        sf = SessionFrames(
            info=self.info,
            steps=self.steps.steps_frame(),
            layers=self.layers.frame(),
            ops=self.ops.frame(),
            nodes=self.nodes.frame(self.NODE_COLS),
            weights=weights_frame(self.info),
            tensor_stats=self.stats.frame(self.STAT_COLS),
            topk=self.steps.topk_frame(),
            seqs=self.steps.seqs_frame(),
            requests=requests_frame(self.info),
            experts=experts_frame(self.expert_parts, self.EXPERT_COLS),
            graphs=self.graphs,
            report=report,
            generated_tokens=self.steps.generated_tokens(),
        )
        sf.experts.attrs["n_expert"] = self.n_expert
        sf.media, sf.encodes = media_frame(self.info), self.encodes.frame()
        sf.encode_media = self.encodes.media_frame()
        sf.encode_layers, sf.encode_ops = self.encode_layers.frame(), self.encode_ops.frame()
        for name, df in self.host.tables(self.info).items():
            setattr(sf, name, df)
        if self.info.contexts or self.info.verifies:
            sf.contexts, sf.spec = contexts_frame(self.info), verify_frame(self.info)
        if self.dev is not None:
            for name, df in self.dev.tables(sf.ops, sf.layers).items():
                setattr(sf, name, df)
        if self.info.allocations or self.memory_rows:
            sf.allocations = allocations_frame(self.info)
            sf.memory = memory_frame(self.memory_rows, self.info)
            sf.step_memory = [m for *_, m in self.memory_rows]
        found = (
            machine_peaks.for_session(self.info, peaks_cache)
            if peaks_cache is not None
            else (None, "")
        )
        roofline.apply(sf, *found)
        return sf


REQUEST_COLS = (
    "id endpoint method status outcome stream t_arrive wait_ns ttft_ns model_ns dur_ns "
    "prompt_tokens gen_tokens tokens_sent slot level error spec_type spec_drafted spec_accepted "
    "spec_verify_steps spec_draft_ns spec_verify_ns spec_rejected_ns"
).split()


def weights_frame(info: SessionInfo) -> pd.DataFrame:
    """The ``weights`` table: the weight inventory of ``session_start``."""
    weights = pd.DataFrame(info.weights)
    if not weights.empty:
        weights["shape"] = weights["shape"].map(shape_text)
        for c in ("name", "type", "buffer"):
            weights[c] = weights[c].astype("category")
        weights["layer"] = weights["layer"].astype("Int64")
    return weights


def requests_frame(info: SessionInfo) -> pd.DataFrame:
    """The ``requests`` table: a row per ``request`` record."""
    t = Table(
        "status t_arrive wait_ns ttft_ns model_ns dur_ns prompt_tokens gen_tokens tokens_sent "
        "stream slot",
        cats="id endpoint method outcome level error",
        nullable="wait_ns ttft_ns model_ns dur_ns tokens_sent slot",
    )
    for r in info.requests:
        status = r.get("status", 0)
        t.add(
            id=r.get("id"), endpoint=r.get("endpoint"), method=r.get("method"),
            status=status, stream=int(bool(r.get("stream"))),
            # what became of it (logs from before it was said: by the status)
            outcome=r.get("outcome") or ("ok" if int(status or 0) < 400 else "error"),
            error=r.get("error"), tokens_sent=r.get("tokens_sent"), level=r.get("level"),
            t_arrive=r.get("t_arrive", 0), wait_ns=r.get("wait"), ttft_ns=r.get("ttft"),
            model_ns=r.get("model"), dur_ns=r.get("dur"),
            prompt_tokens=r.get("prompt_tokens", 0), gen_tokens=r.get("gen_tokens", 0),
            slot=r.get("slot"),  # llama-server: the sequence id of its tokens in `seqs`
        )  # fmt: skip
    df = t.frame(REQUEST_COLS[:17])
    df = df.assign(**request_spec_columns(info.requests))[REQUEST_COLS]
    df["stream"] = df["stream"].astype(bool)
    for c in ("id", "endpoint", "method", "outcome", "level", "error"):
        df[c] = string_categories(df[c])
    return df


def experts_frame(
    parts: list[tuple[int, int, np.ndarray, np.ndarray]], cols: list[str]
) -> pd.DataFrame:
    """The routing records' rows (``parts``: per record its step, ubatch, rows of (layer, expert,
    tokens) and weights), one per (step, ubatch, layer, expert): each record's arrays copied into
    the columns and let go one by one (``parts`` is emptied), so that what they held is the most
    the table takes beside them."""
    n = sum(len(p[2]) for p in parts)
    ints = {c: np.empty(n, np.int64) for c in ("step", "layer", "expert", "tokens", "ubatch")}
    weight = np.empty(n)
    at = 0
    parts.reverse()
    while parts:
        step, ubatch, rows, w = parts.pop()
        m = len(rows)
        ints["step"][at : at + m] = step
        ints["ubatch"][at : at + m] = ubatch
        for k, c in enumerate(("layer", "expert", "tokens")):
            ints[c][at : at + m] = rows[:, k]
        weight[at : at + m] = w
        at += m
    return pd.DataFrame(ints | {"weight": weight}, columns=cols, copy=False)


def load_sessions(
    path: Path | str, *, strict: bool = False, peaks_cache: Path | None = None
) -> list[SessionFrames]:
    """Every session of the log, as tables; each against the peaks that ``peaks_cache`` (the
    directory ``instr peaks`` saves to) holds for the machine that made it, if any."""
    report = ReadReport()
    builders: dict[str, _Builder] = {}
    # the tables' own work per record is small: a forked reader pays only for a bigger log than
    # the trace writers' (``prefetch.TABLES_MIN_BYTES``)
    big = prefetch.TABLES_MIN_BYTES
    try:
        with older_objects_frozen():  # (the tables' columns too: see ``heap``)
            for ev in iter_events_packed(path, strict=strict, report=report, fork_from=big):
                if isinstance(ev, SessionStarted):
                    builders[ev.session.sid] = _Builder(ev.session)
                elif isinstance(ev, StepDone):
                    builders[ev.session.sid].step(ev.step)
                elif isinstance(ev, EncodeDone):
                    builders[ev.session.sid].encode(ev.encode)
                elif isinstance(ev, HostDone):
                    builders[ev.session.sid].host.add(ev.host)
            if not builders:
                raise UserError(f"no session in {path}")
            return [b.frames(report, peaks_cache) for b in builders.values()]
    except OverflowError:
        # (the traces keep such a value, op by op; the tables' columns are 64-bit)
        raise UserError(
            f"{path}: a number in the log does not fit in 64 bits, which the tables need "
            "(a damaged log? `instr to-perfetto` still converts it)"
        ) from None


def load_session(
    path: Path | str,
    sid: str | None = None,
    *,
    strict: bool = False,
    peaks_cache: Path | None = None,
) -> SessionFrames:
    """One session of the log as tables: the latest (the run just made), or the one with session
    id ``sid``; with ``peaks_cache``, against the cached peaks of the machine that made it
    (``load_sessions``)."""
    return choose(load_sessions(path, strict=strict, peaks_cache=peaks_cache), sid, path)


def choose(sessions: list[SessionFrames], sid: str | None, path: Path | str) -> SessionFrames:
    """The session ``sid`` of a log's ``sessions`` (in log order), or the latest."""
    if sid is None:
        return sessions[-1]
    for s in sessions:
        if s.info.sid == sid:
            return s
    raise UserError(
        f"no session {sid} in {path} (it has {', '.join(s.info.sid for s in sessions)})"
    )


# the other sessions a note names (a log may hold thousands)
NOTE_SESSIONS = 8


def sessions_note(path: Path | str, sids: list[tuple[str, str]], shown: str) -> str | None:
    """What a reading command says on stderr when the log holds several sessions (``sids``: each
    one's id and start time, in log order): which one it shows and how to pick another; None
    for a log of one session."""
    if len(sids) < 2:
        return None
    at = next((i for i, (sid, _) in enumerate(sids) if sid == shown), len(sids) - 1)
    which = "the latest" if at == len(sids) - 1 else "session"
    others = [f"{sid} ({when})" for i, (sid, when) in enumerate(sids) if i != at]
    more = len(others) - NOTE_SESSIONS
    listed = ", ".join(others[-NOTE_SESSIONS:]) + (f" and {more} earlier" if more > 0 else "")
    return (
        f"{path} holds {len(sids)} sessions; showing {which}, {at + 1} of {len(sids)} "
        f"({shown}, {sids[at][1]}); --session SID shows another: {listed}"
    )
