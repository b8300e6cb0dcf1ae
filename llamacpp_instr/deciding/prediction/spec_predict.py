"""Speculative decoding's generation tokens/s at a draft length not run (``instr predict
--spec-draft-n-max N``), from llama-server logs that ran the same draft (or n-gram type) at
other lengths.

What the logs measured (their ``spec`` records and the target's steps, ``session.speculation``):

* **acceptance by draft position**, as conditional rates: of the verifies that reached position
  ``i`` (every earlier drafted token accepted, and a token drafted there), the share that accepted
  it. A draft of ``d`` tokens then gives ``E(d) = 1 + sum over i < d of c_0 c_1 ... c_i`` tokens a
  verify (the accepted ones and the target's own). A position no log drafted takes the last
  measured position's rate, and the prediction says so (``extrapolated``).
* **what a round costs**: drafting, per drafted token (the rounds' own time over their tokens:
  the draft's decodes and its sampling); the draft's catch-up and the target's verify step, each
  by its batch of ``d + 1`` tokens (the logs' medians at each size, linear between sizes, and
  beyond the largest from the last two, said so; one token apart from several); the target's
  single-token step (no draft);
  and the server's own time between steps, per step (a request's generation time, from its
  record, less its steps' and rounds').

A request of ``G`` generated tokens is then walked as the server runs it: while more than one
token is left, a round drafts ``min(N, left - 1)`` (the server never drafts past the request's
end), and gives ``E(d)``; the last token is a single-token step. A round drafts at all as often
as the logs' did (a draft model always, an n-gram draft where the text repeats): the others are
single-token steps. Tokens/s is ``G`` over the time,
as llama-server's ``predicted_per_second`` is (its tokens after the first over the time from the
first). ``N = 0`` is a plain decode. Nothing here builds a graph: the logs alone price it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.analysis.frames import SessionFrames, load_session
from llamacpp_instr.converters.analysis.spec_split import split
from llamacpp_instr.converters.session.speculation import Price, model_name, roles
from llamacpp_instr.deciding.measures import Machine

MAX_N = 64  # the longest draft predicted


@dataclass
class Measured:
    """What a set of logs of one draft measured."""

    draft: str  # the draft model's name, or the n-gram type
    logs: list[str] = field(default_factory=list)
    n_max: list[int] = field(default_factory=list)  # the draft lengths the logs ran
    reached: list[int] = field(default_factory=list)  # per position: verifies that reached it
    accepted: list[int] = field(default_factory=list)  # ... and accepted it
    draft_per_token: list[float] = field(default_factory=list)  # a round's time per drafted token
    catchup: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    verify: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    single: list[int] = field(default_factory=list)  # the target's single-token steps
    between: list[float] = field(default_factory=list)  # the server's own time, per step
    gen_tokens: list[int] = field(default_factory=list)  # each request's tokens after its first
    rounds: int = 0  # verify steps
    undrafted: int = 0  # single-token steps where a round drafted nothing (not a request's last)
    measured_tok_s: list[float] = field(default_factory=list)  # each request's, from its record

    def rates(self, n: int) -> tuple[list[float], bool]:
        """The conditional acceptance of positions 0..n-1, and whether any was extrapolated: a
        position beyond every log's draft length takes the last measured rate (one within it that
        no verify reached never mattered: its rate is multiplied by none)."""
        out, extra = [], False
        for i in range(n):
            if i < len(self.reached) and self.reached[i]:
                out.append(self.accepted[i] / self.reached[i])
            else:
                out.append(out[-1] if out else 0.0)
                extra = extra or i >= max(self.n_max or [0])
        return out, extra

    @property
    def drafts(self) -> float:
        """How often a round drafts at all: a draft model always does, an n-gram draft only where
        the text repeats what came before (its other rounds are single-token steps)."""
        seen = self.rounds + self.undrafted
        return self.rounds / seen if seen else 1.0

    def expected(self, d: int) -> float:
        """Tokens a verify of ``d`` drafted tokens gives, on average."""
        rates, _ = self.rates(d)
        total, p = 1.0, 1.0
        for c in rates:
            p *= c
            total += p
        return total


def _at(table: dict[int, list[int]], n: int) -> tuple[float, bool]:
    """The median at size ``n``: measured, linear between the sizes around it, or beyond the
    largest (or below the smallest) from the nearest two (True: extrapolated). A batch of one
    token is priced apart from batches of several (llama.cpp computes a single token's matmuls
    another way, and a batch of several gives a row of logits each): a batch of several is priced
    from the sizes of several the logs ran, where they ran two or more."""
    sizes = sorted(k for k, v in table.items() if v)
    if n > 1 and sum(k > 1 for k in sizes) >= 2:
        sizes = [k for k in sizes if k > 1]
    if not sizes:
        raise UserError("the logs have no verify step to price a batch of the target by")
    med = {k: float(statistics.median(table[k])) for k in sizes}
    if n in med:
        return med[n], False
    lo = [k for k in sizes if k < n]
    hi = [k for k in sizes if k > n]
    if lo and hi:
        a, b = lo[-1], hi[0]
        return med[a] + (med[b] - med[a]) * (n - a) / (b - a), False
    if len(sizes) == 1:
        return med[sizes[0]] * n / sizes[0], True
    a, b = (sizes[-2], sizes[-1]) if lo else (sizes[0], sizes[1])
    return max(med[a] + (med[b] - med[a]) * (n - a) / (b - a), 0.0), True


def draft_key(f: SessionFrames) -> str:
    """What drafted in a log: its draft model's name, or the speculation type of one with none."""
    drafts = [c for c, r in roles(f.info).items() if r == "draft"]
    if drafts:
        name = model_name(f.info, drafts[0])
        m = f.info.contexts.get(drafts[0], {}).get("model", {})
        return f"{name} ({m.get('n_layer')} layers)" if m.get("n_layer") else name or "draft"
    types = {v.type for v in f.info.verifies}
    return ",".join(sorted(types)) or "speculation"


def n_max_of(f: SessionFrames) -> int:
    """The draft length a log ran: its target's ``spec.n_max``, else its longest draft."""
    for c in f.info.contexts.values():
        if c.get("spec", {}).get("n_max"):
            return int(c["spec"]["n_max"])
    return max((v.drafted for v in f.info.verifies), default=0)


def measure(sessions: Sequence[tuple[str, SessionFrames]]) -> Measured:
    """What the logs measured; they must have speculated with one draft."""
    keys = {draft_key(f) for _, f in sessions if f.info.verifies}
    if not keys:
        raise UserError("no log speculated (no spec records: llama-server with -md or --spec-type)")
    if len(keys) > 1:
        raise UserError(f"the logs ran different drafts ({', '.join(sorted(keys))}): give one's")
    m = Measured(draft=keys.pop())
    for name, f in sessions:
        sp = split(f)
        if sp is None or not f.info.verifies:
            continue
        m.logs.append(name)
        m.n_max.append(n_max_of(f))
        for v in f.info.verifies:
            for i in range(min(v.drafted, v.accepted + 1)):  # the positions it reached
                if len(m.reached) <= i:
                    m.reached.append(0)
                    m.accepted.append(0)
                m.reached[i] += 1
                m.accepted[i] += int(i < v.accepted)
            if v.t_draft:
                m.draft_per_token.append(v.draft_dur / v.drafted)
            m.catchup[v.drafted + 1].append(max(v.draft_ns - v.draft_dur, 0))
            m.verify[v.drafted + 1].append(v.verify_dur)
        m.rounds += len(f.info.verifies)
        m.undrafted += max(len(sp.single) - len(f.info.requests), 0)
        m.single += sp.single["dur_ns"].astype("int64").tolist()
        m.verify[1] += sp.single["dur_ns"].astype("int64").tolist()  # a batch of one token
        _requests(m, f, sp)
    return m


def _requests(m: Measured, f: SessionFrames, sp: Any) -> None:
    """Each request's generation: its tokens, its tokens/s from its record, and the server's own
    time per step (its generation time less its steps' and rounds')."""
    by_req: dict[str, list[Any]] = defaultdict(list)
    for v in f.info.verifies:
        by_req[v.request].append(v)
    single = sp.single
    for r in f.info.requests:
        vs = by_req.get(str(r.get("id")), [])
        try:
            t0 = int(r["t_arrive"]) + int(r["ttft"])
            t1 = int(r["t_arrive"]) + int(r["wait"]) + int(r["model"])
            gen = int(r["gen_tokens"])
        except (KeyError, TypeError, ValueError):
            continue
        if gen <= 0 or t1 <= t0:
            continue
        m.gen_tokens.append(gen)
        m.measured_tok_s.append(gen / ((t1 - t0) / 1e9))
        mine = single[(single["t_start"] >= t0) & (single["t_start"] <= t1)]
        busy = int(mine["dur_ns"].sum()) + sum(v.draft_ns + v.verify_dur for v in vs)
        steps = len(vs) + len(mine)
        if steps:
            m.between.append(max((t1 - t0) - busy, 0) / steps)


@dataclass
class SpecPrediction:
    n_max: int
    tok_s: float
    per_verify: float  # tokens a verify gives
    gen_tokens: int  # the request's tokens after its first
    extrapolated: list[str]

    def row(self) -> dict[str, Any]:
        return {
            "n_max": self.n_max,
            "gen_tokens_per_s": self.tok_s,
            "tokens_per_verify": self.per_verify,
            "extrapolated": self.extrapolated,
        }


def predict_n(m: Measured, n_max: int, gen_tokens: int | None = None) -> SpecPrediction:
    """Tokens/s of a request of ``gen_tokens`` (the logs' median) at draft length ``n_max``."""
    g = gen_tokens or int(statistics.median(m.gen_tokens or [48]))
    between = statistics.median(m.between) if m.between else 0.0
    extra: dict[str, None] = {}
    single, x0 = _at(m.verify, 1)
    if x0:
        extra["the target's single-token step, from its verify steps"] = None
    per_token = statistics.median(m.draft_per_token) if m.draft_per_token else 0.0
    left, t = float(g), 0.0
    while left > 0.5:
        d = min(n_max, int(left) - 1)
        if d <= 0:
            t += single + between
            left -= 1
            continue
        verify, x1 = _at(m.verify, d + 1)
        catchup, x2 = _at(m.catchup, d + 1)
        if x1:
            extra[f"the target's verify of {d + 1} tokens, beyond the sizes the logs ran"] = None
        if x2:
            extra[f"the draft's catch-up of {d + 1} tokens, beyond the sizes the logs ran"] = None
        if m.rates(d)[1]:
            n = max(m.n_max or [0])
            extra[f"acceptance beyond draft position {n}, as at the last measured"] = None
        q = m.drafts  # a round that drafts nothing is a single-token step
        t += q * (d * per_token + catchup + verify) + (1 - q) * single + between
        left -= q * m.expected(d) + (1 - q)
    per_verify = m.expected(n_max) if n_max > 0 else 1.0
    return SpecPrediction(n_max, g / (t / 1e9) if t else 0.0, per_verify, g, list(extra))


def model_price(f: SessionFrames, machine: Machine) -> Price | None:
    """``predict``'s price of one token of the target (``instr summary`` and ``instr requests``,
    for a log with no single-token step of the target): its model file as the log names it, at
    the log's threads, priced from the log's own ops on ``machine``; None where it cannot be."""
    from llamacpp_instr.deciding.prediction import predict as op_predict

    tgt = next((c for c, r in roles(f.info).items() if r == "target"), None)
    path = Path(str(f.info.contexts.get(tgt or -1, {}).get("model", {}).get("path") or ""))
    sp = split(f)
    if not str(path) or not path.is_file() or sp is None or f.ops.empty:
        return None
    ctx = f.info.context or {}
    depth = int(sp.gen["pos0"].median()) if len(sp.gen) else 0
    t = op_predict.Target(
        model=path,
        threads=int(ctx.get("n_threads") or 1),
        n_prompt=0,
        n_gen=8,
        depth=max(depth, 0),
        n_batch=int(ctx.get("n_batch") or 512),
        n_ubatch=int(ctx.get("n_ubatch") or 512),
        flash_attn=bool(ctx.get("flash_attn")),
        type_k=str(ctx.get("type_k") or "f16"),
        type_v=str(ctx.get("type_v") or "f16"),
    )
    try:
        p = op_predict.price(t, op_predict.fit([f], machine=machine), [f], ["this log"], machine)
    except UserError:
        return None
    if p.gen is None or p.gen.value <= 0:
        return None
    threads = f"{t.threads} thread{'s' * (t.threads != 1)}"
    return Price.from_model(1e9 / p.gen.value, f"{path.name} at {threads}")


def run(logs: Sequence[Path], n_max: int, gen_tokens: int | None = None) -> dict[str, Any]:
    """``instr predict --spec-draft-n-max``: the prediction at ``n_max``, and at every length up to
    the longest of it and the logs' (and 0: no speculation), the fastest named."""
    if not 0 <= n_max <= MAX_N:
        raise UserError(f"--spec-draft-n-max takes 0 to {MAX_N}, not {n_max}")
    return run_sessions([(str(p), load_session(p)) for p in logs], n_max, gen_tokens)


def run_sessions(
    sessions: Sequence[tuple[str, SessionFrames]], n_max: int, gen_tokens: int | None = None
) -> dict[str, Any]:
    """``run`` over logs already loaded (name, frames)."""
    m = measure(sessions)
    top = max([n_max, 8, *m.n_max])
    table = [predict_n(m, n, gen_tokens) for n in range(0, top + 1)]
    best = max(table, key=lambda p: p.tok_s)
    return {
        "prediction": True,
        "draft": m.draft,
        "logs": m.logs,
        "logs_n_max": m.n_max,
        "verifies": m.reached[0] if m.reached else 0,
        "acceptance_by_position": m.rates(max(m.n_max or [1]))[0],
        "measured_gen_tokens_per_s": (
            statistics.median(m.measured_tok_s) if m.measured_tok_s else None
        ),
        "asked": table[n_max].row(),
        "by_n_max": [p.row() for p in table],
        "best_n_max": best.n_max,
        "threads": sorted({int(f.info.context.get("n_threads") or 0) for _, f in sessions}),
    }
