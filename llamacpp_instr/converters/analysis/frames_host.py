"""The host's work between steps as tables (``load_session(...).samplers``, ``.host``,
``.host_seqs``, ``.chains``, ``.context_perf``), from ``host``, ``chain`` and ``perf`` records.

* ``samplers`` — one row per part of a ``host`` record (detailed and above): step (the step whose
  outputs were sampled), ctx, seq (null: none in particular), request, kind (``sampler``: a sampler
  of the chain; ``grammar``: the grammar outside the chain, ``check``, ``full`` or ``accept``;
  ``sampling``: the candidates, the chain's own time, a sampler applied outside the chain;
  ``backend``: a sampler that ran in the graph, no time of its own here; ``host``: the program's
  own work), sampler (the name), ns, n (times it ran).
* ``host`` — one row per ``host`` record, at every level: step, ctx, level, t_start, dur_ns (its
  first to its last recorded instant), sampled (outputs), sample_ns, chain_ns (of which in the
  sampler chains: what llama_perf_sampler counts), host_ns (the program's own work), cpu_ns (the
  decoding thread's CPU time from the step's end to the context's next step; null where unknown).
* ``host_seqs`` — one row per sequence of a ``host`` record (detailed and above): step, ctx, seq,
  request, sampled, sample_ns, chain_ns, host_ns, t_start and t_end (its first and last recorded
  instants).
* ``chains`` — one row per ``chain`` record: ctx, seq, request, samplers (their names, in chain
  order, joined by ``,``), t_sample_ns (llama.cpp's own counter, in us there), n_sample.
* ``context_perf`` — one row per ``perf`` record: ctx, t_p_eval_ns, n_p_eval, t_eval_ns, n_eval,
  n_reused (llama_perf_context, in us there).
"""

from __future__ import annotations

import pandas as pd

from ..reading.decode.host import HostWork
from ..reading.decode.sessions import SessionInfo
from .table_columns import Table, string_categories

SAMPLER_COLS = "step ctx seq request kind sampler ns n".split()
HOST_COLS = "step ctx level t_start dur_ns sampled sample_ns chain_ns host_ns cpu_ns".split()
HOST_SEQ_COLS = "step ctx seq request sampled sample_ns chain_ns host_ns t_start t_end".split()
CHAIN_COLS = "ctx seq request samplers t_sample_ns n_sample".split()
PERF_COLS = "ctx t_p_eval_ns n_p_eval t_eval_ns n_eval n_reused".split()


class HostBuilder:
    """The host tables, a ``host`` record at a time."""

    def __init__(self) -> None:
        self.parts = Table("step ctx seq ns n", cats="request kind sampler", nullable="seq")
        self.records = Table(
            "step ctx t_start dur_ns sampled sample_ns chain_ns host_ns cpu_ns",
            cats="level",
            nullable="cpu_ns",
        )
        self.seqs = Table(
            "step ctx seq sampled sample_ns chain_ns host_ns t_start t_end",
            cats="request",
            nullable="seq",
        )

    def add(self, h: HostWork) -> None:
        self.records.add(
            step=h.step, ctx=h.ctx, level=h.level, t_start=h.t_start, dur_ns=h.dur,
            sampled=h.sampled, sample_ns=h.sample_ns, chain_ns=h.chain_ns, host_ns=h.host_ns,
            cpu_ns=h.cpu_ns,
        )  # fmt: skip
        for q in h.seqs:
            self.seqs.add(
                step=h.step, ctx=h.ctx, seq=q.seq, request=q.request, sampled=q.sampled,
                sample_ns=q.sample_ns, chain_ns=q.chain_ns, host_ns=q.host_ns,
                t_start=h.t_start + q.start_off, t_end=h.t_start + q.end_off,
            )  # fmt: skip
        for p in h.parts:
            self.parts.add(
                step=h.step, ctx=h.ctx, seq=p.seq, request=p.request, kind=p.kind,
                sampler=p.name, ns=p.ns, n=p.n,
            )  # fmt: skip

    def tables(self, info: SessionInfo) -> dict[str, pd.DataFrame]:
        out = {
            "samplers": self.parts.frame(SAMPLER_COLS),
            "host": self.records.frame(HOST_COLS),
            "host_seqs": self.seqs.frame(HOST_SEQ_COLS),
            "chains": chains_frame(info),
            "context_perf": perf_frame(info),
        }
        for name, cols in (
            ("samplers", ("request", "kind", "sampler")),
            ("host", ("level",)),
            ("host_seqs", ("request",)),
            ("chains", ("request", "samplers")),
        ):
            for c in cols:
                out[name][c] = string_categories(out[name][c])
        return out


def chains_frame(info: SessionInfo) -> pd.DataFrame:
    t = Table("ctx seq t_sample_ns n_sample", cats="request samplers", nullable="seq")
    for c in info.chains:
        t.add(
            ctx=c.ctx, seq=c.seq, request=c.request, samplers=",".join(c.samplers),
            t_sample_ns=c.t_sample_us * 1000, n_sample=c.n_sample,
        )  # fmt: skip
    return t.frame(CHAIN_COLS)


def perf_frame(info: SessionInfo) -> pd.DataFrame:
    t = Table("ctx t_p_eval_ns n_p_eval t_eval_ns n_eval n_reused")
    for p in info.perf:
        t.add(
            ctx=p.ctx, t_p_eval_ns=p.t_p_eval_us * 1000, n_p_eval=p.n_p_eval,
            t_eval_ns=p.t_eval_us * 1000, n_eval=p.n_eval, n_reused=p.n_reused,
        )  # fmt: skip
    return t.frame(PERF_COLS)
