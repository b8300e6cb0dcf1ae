"""A session's decode steps' own tables, as ``frames``' builder reads the steps (see ``frames``
for their columns): ``steps`` (a row per step, its role where the log says: ``frames_spec``),
``seqs`` (a row per sequence of a step's batch), ``topk`` (verbose: each output's top tokens),
and the tokens the run generated, in step order. What a step computed (its layers, ops, graphs,
memory, experts) goes to the tables every pass shares (``frames._Builder.computes``)."""

from __future__ import annotations

from operator import itemgetter

import pandas as pd

from ..reading.decode.sessions import SessionInfo
from ..reading.decode.steps import Step
from ..session.step_times import ready_at
from .frames_spec import step_roles
from .table_columns import Table, string_categories

_FIRST = itemgetter(0)


class StepTables:
    """The rows of a session's decode steps, and their tables (``frames``)."""

    STEP_COLS = (
        "step ctx kind n_tokens pos0 pos1 t_start dur_ns status n_outputs kv_used op_ns ended "
        "request level llama_decode_ns media media_slice role"
    ).split()
    SEQ_COLS = "step ctx seq n_tokens pos0 pos1".split()
    TOPK_COLS = "step row rank token logit".split()

    def __init__(self, info: SessionInfo) -> None:
        self.info = info
        self.steps = Table(
            "step ctx n_tokens pos0 pos1 t_start dur_ns status n_outputs kv_used op_ns ended "
            "llama_decode_ns media media_slice",
            cats="kind request level",
            nullable="status media media_slice",
        )
        self.seqs = Table("step ctx seq n_tokens pos0 pos1")
        self.topk = Table("step row rank token", "logit")
        self.generated: list[tuple[int, list[int]]] = []  # per generation step: index, tokens

    def add(self, s: Step, op_ns: int) -> None:
        """A decode step (``op_ns``: the time of its timed ops): its rows of ``steps``, ``seqs``
        and ``topk``, and the tokens it generated."""
        medium = s.media[0] if s.media else (None, None)
        self.steps.add(
            step=s.index, ctx=s.ctx, kind=s.kind, n_tokens=s.n_tokens, pos0=s.pos[0],
            pos1=s.pos[1], t_start=s.start, dur_ns=ready_at(s) - s.start, status=s.status,
            n_outputs=s.n_outputs, kv_used=s.kv_used, op_ns=op_ns, ended=int(s.ended),
            request=s.request, level=s.level or self.info.level, llama_decode_ns=s.dur,
            media=medium[0], media_slice=medium[1],
        )  # fmt: skip
        if s.kind == "gen":
            self.generated.append((s.index, s.tokens))
        for seq, n_tok, p0, p1 in s.seqs:
            self.seqs.add(step=s.index, ctx=s.ctx, seq=seq, n_tokens=n_tok, pos0=p0, pos1=p1)
        for row in s.topk:
            for rank, (tok, logit) in enumerate(zip(row["ids"], row["logits"], strict=False)):
                self.topk.add(
                    step=s.index, row=row.get("row", 0), rank=rank, token=tok, logit=logit
                )

    def steps_frame(self) -> pd.DataFrame:
        """The ``steps`` table, its steps' roles with it."""
        steps = self.steps.frame(self.STEP_COLS[:-1])
        steps["ended"] = steps["ended"].astype(bool)
        steps["request"] = string_categories(steps["request"])
        steps["level"] = string_categories(steps["level"])
        steps["role"] = step_roles(steps, self.info)
        return steps

    def seqs_frame(self) -> pd.DataFrame:
        return self.seqs.frame(self.SEQ_COLS)

    def topk_frame(self) -> pd.DataFrame:
        return self.topk.frame(self.TOPK_COLS)

    def generated_tokens(self) -> list[int]:
        """The tokens the run generated, in step order."""
        return [t for _, tokens in sorted(self.generated, key=_FIRST) for t in tokens]
