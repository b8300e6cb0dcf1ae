"""The per-op tables: ``load_sessions`` as it was before it worked in bulk.

One ``OpTiming`` per op from ``session.fold.iter_events`` (the per-op decoding), rows appended one by
one, each column converted on its own: every table, dtype, category order, skipped-record report
and session info of ``converters.frames`` must match what this gives (tests/test_frames_bulk_matches_reference.py),
on the fixtures, on real logs, on a bigger synthetic log, and on damaged ones. The tables'
columns are listed here, in order, as the analysis API documents them.
"""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

import pandas as pd

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.analysis import roofline
from llamacpp_instr.converters.analysis.frames import SessionFrames
from llamacpp_instr.converters.analysis.frames_host import HostBuilder
from llamacpp_instr.converters.analysis.frames_spec import request_spec_columns, step_roles
from llamacpp_instr.converters.analysis.table_columns import string_categories
from llamacpp_instr.converters.reading.decode.graphs import Graph
from llamacpp_instr.converters.reading.decode.media import Encode
from llamacpp_instr.converters.reading.decode.sessions import (
    EncodeDone,
    HostDone,
    SessionInfo,
    SessionStarted,
    StepDone,
)
from llamacpp_instr.converters.reading.decode.steps import Step
from llamacpp_instr.converters.reading.reader import ReadReport
from llamacpp_instr.converters.session import derive
from llamacpp_instr.converters.session.fold import iter_events

STEP_COLS = (
    "step ctx kind n_tokens pos0 pos1 t_start dur_ns status n_outputs kv_used op_ns ended request "
    "level llama_decode_ns media media_slice role"
).split()
SEQ_COLS = "step ctx seq n_tokens pos0 pos1".split()
REQUEST_COLS = (
    "id endpoint method status outcome stream t_arrive wait_ns ttft_ns model_ns dur_ns "
    "prompt_tokens gen_tokens tokens_sent slot level error spec_type spec_drafted spec_accepted "
    "spec_verify_steps spec_draft_ns spec_verify_ns spec_rejected_ns"
).split()
LAYER_COLS = "step ubatch layer t_start dur_ns n_ops".split()
OP_COLS = (
    "step ubatch graph node name op label category layer t_start dur_ns n_fused shape dtype "
    "weight weight_type est_flops est_bytes expert_bytes"
).split()
EXPERT_COLS = "step layer expert tokens weight ubatch".split()
NODE_COLS = "graph node name op label layer shape dtype bytes flags".split()
STAT_COLS = "step ubatch node name min max mean std n_nan n_inf".split()
TOPK_COLS = "step row rank token logit".split()
MEDIA_COLS = (
    "id kind nx ny frames bytes hash slices tokens n_pos t_load load_ns t_preprocess "
    "preprocess_ns ts"
).split()
ENCODE_COLS = (
    "step ctx encoder t_start dur_ns compute_ns op_ns n_tokens media slice n_slices first "
    "target_ctx target_seq request level status ended"
).split()


class _RefCat:
    def __init__(self) -> None:
        self.codes = array("i")
        self.index: dict[str, int] = {}

    def append(self, value: str | None) -> None:
        if value is None:
            self.codes.append(-1)
            return
        code = self.index.get(value)
        if code is None:
            code = self.index[value] = len(self.index)
        self.codes.append(code)

    def series(self) -> pd.Categorical:
        return pd.Categorical.from_codes(self.codes, categories=list(self.index))  # type: ignore[arg-type]


class _RefTable:
    def __init__(
        self, ints: str = "", floats: str = "", cats: str = "", nullable: str = ""
    ) -> None:
        self.ints = {c: array("q") for c in ints.split()}
        self.floats = {c: array("d") for c in floats.split()}
        self.cats = {c: _RefCat() for c in cats.split()}
        self.nullable = set(nullable.split())

    def add(self, **row: Any) -> None:
        for c, a in self.ints.items():
            v = row[c]
            a.append(-1 if v is None else int(v))
        for c, f in self.floats.items():
            v = row[c]
            f.append(float("nan") if v is None else float(v))
        for c, k in self.cats.items():
            k.append(None if row[c] is None else str(row[c]))

    def frame(self, order: list[str]) -> pd.DataFrame:
        data: dict[str, Any] = {}
        for c, a in self.ints.items():
            s = pd.Series(a, dtype="int64")
            data[c] = s.where(s >= 0).astype("Int64") if c in self.nullable else s
        for c, f in self.floats.items():
            data[c] = pd.Series(f, dtype="float64")
        for c, k in self.cats.items():
            data[c] = k.series()
        return pd.DataFrame({c: data[c] for c in order})


def _shape(shape: list[int]) -> str:
    return "x".join(map(str, shape))


def _ops_table() -> _RefTable:
    return _RefTable(
        "step ubatch graph node layer t_start dur_ns n_fused est_flops est_bytes",
        cats="name op label category shape dtype weight weight_type expert_bytes",
        nullable="layer",
    )


class _RefBuilder:
    def __init__(self, info: SessionInfo) -> None:
        self.info = info
        self.steps = _RefTable(
            "step ctx n_tokens pos0 pos1 t_start dur_ns status n_outputs kv_used op_ns ended "
            "llama_decode_ns media media_slice",
            cats="kind request level",
            nullable="status media media_slice",
        )
        self.seqs = _RefTable("step ctx seq n_tokens pos0 pos1")
        self.layers = _RefTable("step ubatch layer t_start dur_ns n_ops")
        self.ops = _ops_table()
        # an encoder's encodes: their own rows, layer spans and ops
        self.encodes = _RefTable(
            "step ctx t_start dur_ns compute_ns op_ns n_tokens media slice n_slices first "
            "target_ctx target_seq status ended",
            cats="encoder request level",
            nullable="media slice target_ctx status",
        )
        self.encode_media = _RefTable("step media slices")
        self.encode_layers = _RefTable("step ubatch layer t_start dur_ns n_ops")
        self.encode_ops = _ops_table()
        self.experts = _RefTable("step layer expert tokens ubatch", "weight")
        self.nodes = _RefTable(
            "graph node layer bytes", cats="name op label shape dtype flags", nullable="layer"
        )
        self.stats = _RefTable("step ubatch node n_nan n_inf", "min max mean std", cats="name")
        self.topk = _RefTable("step row rank token", "logit")
        self.graphs: dict[int, Graph] = {}
        # a run on several devices: each op's and layer span's device, by name
        listed = [d for d in info.machine.get("devices", []) if isinstance(d, dict)]
        self.device_names = {d["index"]: d["name"] for d in listed}
        self.cpu = next((d["index"] for d in listed if d["backend"] == "CPU"), -1)
        self.op_device: list[str | None] = []
        self.layer_device: list[str | None] = []

    def step(self, s: Step | Encode) -> None:
        # until its outputs were ready: its last compute's or RPC command's end, if later
        ready = (
            max(
                [
                    s.end,
                    *(c.start + c.dur for c in s.computes),
                    *(r.end for t in s.transfers for r in t.rows),
                ]
            )
            if s.ended
            else s.end
        )
        if isinstance(s, Encode):
            enc = s
            arch = self.info.contexts.get(s.ctx, {}).get("model", {}).get("architecture")
            m0, k0 = s.media[0] if s.media else (None, None)
            self.encodes.add(
                step=s.index, ctx=s.ctx, encoder=arch, t_start=s.start, dur_ns=ready - s.start,
                compute_ns=sum(c.dur for c in s.computes), op_ns=s.op_time, n_tokens=s.n_tokens,
                media=m0, slice=k0, n_slices=len(s.media) + enc.more,
                first=int(enc.first), target_ctx=enc.target[0] if enc.target else None,
                target_seq=enc.target[1] if enc.target else -1, request=s.request,
                level=s.level or self.info.level, status=s.status, ended=int(s.ended),
            )  # fmt: skip
            for m in dict.fromkeys(m for m, _ in s.media):
                n = sum(1 for x, _ in s.media if x == m)
                self.encode_media.add(step=s.index, media=m, slices=n)
        else:
            m0, k0 = s.media[0] if s.media else (None, None)
            for seq, n_tok, p0, p1 in s.seqs:
                self.seqs.add(step=s.index, ctx=s.ctx, seq=seq, n_tokens=n_tok, pos0=p0, pos1=p1)
            self.steps.add(
                step=s.index, ctx=s.ctx, kind=s.kind, n_tokens=s.n_tokens, pos0=s.pos[0],
                pos1=s.pos[1], t_start=s.start, dur_ns=ready - s.start, status=s.status,
                n_outputs=s.n_outputs, kv_used=s.kv_used, op_ns=s.op_time, ended=int(s.ended),
                request=s.request, level=s.level or self.info.level, llama_decode_ns=s.dur,
                media=m0, media_slice=k0,
            )  # fmt: skip
        encode = isinstance(s, Encode)
        layers, ops = (self.encode_layers, self.encode_ops) if encode else (self.layers, self.ops)
        for c in s.computes:
            splits = c.place.splits if c.place is not None else []
            for k, lay in enumerate(c.layers):
                d = -1 if c.layer_device is None else int(c.layer_device[k])
                if not encode:
                    self.layer_device.append(self.device_names.get(self.cpu if d < 0 else d))
                layers.add(
                    step=s.index, ubatch=c.ubatch, layer=lay.layer, t_start=lay.start,
                    dur_ns=lay.dur, n_ops=lay.n_ops,
                )  # fmt: skip
            g = c.graph
            if g is None:
                continue
            if g.id not in self.graphs:
                self.graphs[g.id] = g
                for n in g.nodes:
                    self.nodes.add(
                        graph=g.id, node=n.i, name=n.name, op=n.op, label=n.label, layer=n.layer,
                        shape=_shape(n.shape), dtype=n.dtype, bytes=n.bytes, flags=",".join(n.flags),
                    )  # fmt: skip
            for op in c.ops:
                n = op.node
                w = derive.weight_source(n)
                est_bytes = derive.bytes_moved(n, g) + sum(
                    derive.bytes_moved(f, g) for f in op.fused
                )
                expert_bytes = None
                exps = derive.src_shape(n.src[0], g) + [1, 1, 1] if n.src else [1, 1, 1]
                if n.op == "MUL_MAT_ID" and exps[2] >= 2:
                    # the experts this compute's router sent tokens to, in the op's layer
                    used = {
                        e for r in s.experts if r.ubatch == c.ubatch
                        for la, e, t in r.rows.tolist() if la == n.layer and t > 0
                    }  # fmt: skip
                    expert_bytes = "routed" if used else "all experts"
                    if used:
                        whole = derive.src_bytes(n.src[0], g)
                        est_bytes -= whole - whole * len(used) // exps[2]
                held = [x.device for x in splits if x.i_start <= n.i < x.i_end]
                if not encode:
                    self.op_device.append(self.device_names.get(held[0] if held else self.cpu))
                ops.add(
                    step=s.index, ubatch=c.ubatch, graph=g.id, node=n.i, name=n.name, op=n.op,
                    label=n.label, category=derive.category(n), layer=n.layer, t_start=op.start,
                    dur_ns=op.dur, n_fused=len(op.fused), shape=_shape(n.shape), dtype=n.dtype,
                    weight=w["name"] if w else None, weight_type=w["type"] if w else None,
                    est_flops=derive.flops(n, g) + sum(derive.flops(f, g) for f in op.fused),
                    est_bytes=est_bytes, expert_bytes=expert_bytes,
                )  # fmt: skip
                if op.stats is not None:
                    mn, mx, mean, std, n_nan, n_inf = op.stats
                    self.stats.add(
                        step=s.index, ubatch=c.ubatch, node=n.i, name=n.name, min=mn, max=mx,
                        mean=mean, std=std, n_nan=n_nan, n_inf=n_inf,
                    )  # fmt: skip
        for r in s.experts:
            for (la, e, t), w in zip(r.rows.tolist(), r.weight.tolist(), strict=True):
                self.experts.add(
                    step=s.index, layer=la, expert=e, tokens=t, ubatch=r.ubatch, weight=w
                )
        for row in s.topk if isinstance(s, Step) else []:
            for rank, (tok, logit) in enumerate(zip(row["ids"], row["logits"], strict=False)):
                self.topk.add(
                    step=s.index, row=row.get("row", 0), rank=rank, token=tok, logit=logit
                )

    def media(self) -> pd.DataFrame:
        t = _RefTable(
            "id nx ny frames bytes slices tokens n_pos t_load load_ns t_preprocess "
            "preprocess_ns ts",
            cats="kind hash",
            nullable="t_load load_ns t_preprocess preprocess_ns",
        )
        seen = set()
        for m in self.info.media:
            if m.id not in seen:
                seen.add(m.id)
                t.add(
                    id=m.id, kind=m.kind, nx=m.nx, ny=m.ny, frames=m.frames, bytes=m.bytes,
                    hash=m.hash_text, slices=m.slices, tokens=m.tokens, n_pos=m.n_pos,
                    t_load=m.t_load, load_ns=m.load_ns if m.t_load >= 0 else -1,
                    t_preprocess=m.t_preprocess,
                    preprocess_ns=m.preprocess_ns if m.t_preprocess >= 0 else -1, ts=m.ts,
                )  # fmt: skip
        df = t.frame(MEDIA_COLS)
        for c in ("kind", "hash"):
            df[c] = string_categories(df[c])
        return df

    def encodes_frame(self) -> pd.DataFrame:
        df = self.encodes.frame(ENCODE_COLS)
        df["target_seq"] = df["target_seq"].astype("Int64").where(df["target_ctx"].notna())
        for c in ("first", "ended"):
            df[c] = df[c].astype(bool)
        for c in ("encoder", "request", "level"):
            df[c] = string_categories(df[c])
        return df

    def requests(self) -> pd.DataFrame:
        t = _RefTable(
            "status t_arrive wait_ns ttft_ns model_ns dur_ns prompt_tokens gen_tokens tokens_sent "
            "stream slot",
            cats="id endpoint method outcome level error",
            nullable="wait_ns ttft_ns model_ns dur_ns tokens_sent slot",
        )
        for r in self.info.requests:
            status = r.get("status", 0)
            t.add(
                id=r.get("id"), endpoint=r.get("endpoint"), method=r.get("method"),
                status=status, stream=int(bool(r.get("stream"))),
                outcome=r.get("outcome") or ("ok" if int(status or 0) < 400 else "error"),
                error=r.get("error"), tokens_sent=r.get("tokens_sent"), level=r.get("level"),
                t_arrive=r.get("t_arrive", 0), wait_ns=r.get("wait"), ttft_ns=r.get("ttft"),
                model_ns=r.get("model"), dur_ns=r.get("dur"),
                prompt_tokens=r.get("prompt_tokens", 0), gen_tokens=r.get("gen_tokens", 0),
                slot=r.get("slot"),
            )  # fmt: skip
        df = t.frame(REQUEST_COLS[:17])
        df = df.assign(**request_spec_columns(self.info.requests))[REQUEST_COLS]
        df["stream"] = df["stream"].astype(bool)
        for c in ("id", "endpoint", "method", "outcome", "level", "error"):
            df[c] = string_categories(df[c])
        return df

    def frames(self, report: ReadReport) -> SessionFrames:
        steps = self.steps.frame(STEP_COLS[:-1])
        steps["ended"] = steps["ended"].astype(bool)
        steps["request"] = string_categories(steps["request"])
        steps["level"] = string_categories(steps["level"])
        steps["role"] = step_roles(steps, self.info)
        weights = pd.DataFrame(self.info.weights)
        if not weights.empty:
            weights["shape"] = weights["shape"].map(_shape)
            for c in ("name", "type", "buffer"):
                weights[c] = weights[c].astype("category")
            weights["layer"] = weights["layer"].astype("Int64")
        layers, ops = self.layers.frame(LAYER_COLS), self.ops.frame(OP_COLS)
        ops["expert_bytes"] = string_categories(ops["expert_bytes"])
        encode_ops = self.encode_ops.frame(OP_COLS)
        encode_ops["expert_bytes"] = string_categories(encode_ops["expert_bytes"])
        if len(self.device_names) > 1:  # the device columns (the machine's order)
            names = [self.device_names[k] for k in sorted(self.device_names)]
            layers["device"] = pd.Categorical(self.layer_device, categories=names)
            ops["device"] = pd.Categorical(self.op_device, categories=names)
        return SessionFrames(
            info=self.info,
            steps=steps,
            layers=layers,
            ops=ops,
            nodes=self.nodes.frame(NODE_COLS),
            weights=weights,
            tensor_stats=self.stats.frame(STAT_COLS),
            topk=self.topk.frame(TOPK_COLS),
            seqs=self.seqs.frame(SEQ_COLS),
            requests=self.requests(),
            experts=self.experts.frame(EXPERT_COLS),
            graphs=self.graphs,
            report=report,
            media=self.media(),
            encodes=self.encodes_frame(),
            encode_media=self.encode_media.frame("step media slices".split()).astype(
                {"slices": "int32"}
            ),
            encode_layers=self.encode_layers.frame(LAYER_COLS),
            encode_ops=encode_ops,
        )


def reference_load_sessions(path: Path | str, *, strict: bool = False) -> list[SessionFrames]:
    """Every session of the log, as tables, op by op (no peaks: the roofline columns empty)."""
    report = ReadReport()
    builders: dict[str, _RefBuilder] = {}
    # the host's work between steps has one builder (no per-op form to check it against)
    hosts: dict[str, HostBuilder] = {}
    for ev in iter_events(path, strict=strict, report=report):
        if isinstance(ev, SessionStarted):
            builders[ev.session.sid] = _RefBuilder(ev.session)
            hosts[ev.session.sid] = HostBuilder()
        elif isinstance(ev, StepDone):
            builders[ev.session.sid].step(ev.step)
        elif isinstance(ev, EncodeDone):
            builders[ev.session.sid].step(ev.encode)
        elif isinstance(ev, HostDone):
            hosts[ev.session.sid].add(ev.host)
    if not builders:
        raise UserError(f"no session in {path}")
    out = [b.frames(report) for b in builders.values()]
    for f, h in zip(out, hosts.values(), strict=True):
        for name, df in h.tables(f.info).items():
            setattr(f, name, df)
    for f in out:  # the roofline columns (roofline.py), without peaks (no cache given)
        roofline.apply(f, None, "")
    return out
