"""Why requests were slow, as a report: ``instr requests`` and the summary's section of it.

The figures are ``session.request_causes``'; this module only lays them out: a table of every
request, slowest first, with its time split and what its prompt cache reused, and a paragraph
for each of the slowest saying why (the cache, and its late tokens with what shared their
batches).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..analysis.draft_in_gaps import draft_in_gaps
from ..session.cache_media import MediaStep, Medium, Parting, partings
from ..session.request_causes import HostRow, RequestStory, StepRow, stories
from ..session.request_experts import RequestExperts, StepRouting, request_experts
from ..session.request_media import EncodeRow, PromptRow, RequestMedia, request_media
from ..session.speculation import SpecTotals
from .report import Chart, Column, Fact, Report, Section, Series, Table
from .request_share import indexed_step_rows, step_rows

if TYPE_CHECKING:  # pandas loads with the frames, not with this module
    from ..analysis.frames import SessionFrames

EXPLAINED = 5  # the slowest requests explained in words
CHARTED = 20  # the slowest requests drawn in the HTML report

COLUMNS = [
    Column("id", "request"),
    Column("outcome", "outcome"),
    Column("total_ms", "total (ms)", "f1"),
    Column("queue_ms", "queue (ms)", "f1"),
    Column("prompt_ms", "prompt (ms)", "f1"),
    Column("generation_ms", "generation (ms)", "f1"),
    Column("stream_ms", "stream (ms)", "f1"),
    Column("prompt_tokens", "prompt tokens", "int"),
    Column("cache_reused_tokens", "reused from cache", "int"),
    Column("cache_miss_reason", "not reused because"),
    Column("late", "late tokens", "int"),
]
SAMPLER_COLUMN = Column("top_sampler", "costliest sampler (ms)")
MEDIA_COLUMNS = [
    Column("encode_ms", "encode (ms)", "f1"),
    Column("media_prefill_ms", "media prefill (ms)", "f1"),
    Column("text_prefill_ms", "text prefill (ms)", "f1"),
]
SPEC_COLUMNS = [
    Column("drafted", "drafted", "int"),
    Column("accepted", "accepted", "int"),
    Column("verdict", "speculation"),
]


def request_stories(f: SessionFrames, rows: list[StepRow] | None = None) -> list[RequestStory]:
    """Every request of the session, slowest first; ``rows``: ``step_rows(f)``, when the caller
    has them already."""
    if not f.info.requests:
        return []
    out = stories(
        f.info.requests,
        step_rows(f) if rows is None else rows,
        step_rows(f, "draft"),
        host_rows(f),
        cache_partings(f),
    )
    media = media_by_request(f)
    for s in out:
        s.media = media.get(s.id)
    return out


def media_by_request(f: SessionFrames) -> dict[str, RequestMedia]:
    """Each request's encodes and the prefill of its media and its text ({} without encodes)."""
    import pandas as pd  # (with the frames)

    enc = f.encodes
    if enc.empty or not f.info.requests:
        return {}
    carried = dict(zip(f.steps["step"].tolist(), f.steps["media"].astype(object), strict=True))
    rows: list[PromptRow] = [
        (start, dur, seqs, None if pd.isna(carried.get(step)) else int(carried[step]))
        for (start, dur, _, seqs), step in indexed_step_rows(f)
    ]
    em = f.encode_media
    media_of = em.groupby("step")["media"].unique() if len(em) else pd.Series(dtype=object)
    encodes: list[EncodeRow] = [
        (int(t), int(d), req if isinstance(req, str) else None,
         None if pd.isna(seq) else int(seq), tuple(int(m) for m in media_of.get(step, ())),
         bool(first))
        for step, t, d, req, seq, first in zip(
            enc["step"], enc["t_start"], enc["dur_ns"], enc["request"].astype(object),
            enc["target_seq"].astype(object), enc["first"], strict=True,
        )
    ]  # fmt: skip
    encodes.sort(key=lambda e: e[0])
    nouns = {
        int(i): "sound" if k == "audio" else str(k)
        for i, k in zip(f.media["id"], f.media["kind"].astype(str), strict=True)
    }
    return request_media(f.info.requests, rows, encodes, nouns)


def cache_partings(f: SessionFrames) -> dict[str, Parting]:
    """Per request, the image or sound each side had where its prompt parted from its slot's
    cache ({} without media)."""
    import pandas as pd  # (with the frames)

    if f.media.empty or not f.info.requests:
        return {}
    st = f.steps[f.steps["media"].notna()]
    by_seq: dict[tuple[int, int], list[tuple[int, int]]] = {}
    if f.seqs is not None and not f.seqs.empty:
        cols = f.seqs[["ctx", "step", "seq", "pos0"]].astype("int64")
        for ctx, step, q, pos in cols.itertuples(False):
            by_seq.setdefault((int(ctx), int(step)), []).append((int(q), int(pos)))
    steps: list[MediaStep] = [
        (int(t), by_seq.get((int(ctx), int(step))) or [(0, int(pos))], int(m))
        for ctx, step, t, pos, m in st[["ctx", "step", "t_start", "pos0", "media"]].itertuples(
            False
        )
        if not pd.isna(m)
    ]
    steps.sort(key=lambda s: s[0])
    media = [
        Medium(int(i), str(k), str(h), int(b))
        for i, k, h, b in zip(
            f.media["id"], f.media["kind"].astype(str), f.media["hash"].astype(str),
            f.media["bytes"], strict=True,
        )
    ]  # fmt: skip
    return partings(f.info.requests, steps, media)


def costliest_samplers(f: SessionFrames) -> dict[str, tuple[str, int]]:
    """Per request, the sampler (or the grammar's pass) that took most of its sampling, with its
    ns ({} for a log that does not name them)."""
    parts = f.samplers
    if parts.empty:
        return {}
    kind = parts["kind"].astype(str)
    p = parts[kind.isin(["sampler", "grammar", "sampling"]) & parts["request"].notna()]
    if p.empty:
        return {}
    label = [
        f"grammar {n}" if k == "grammar" else n
        for k, n in zip(p["kind"].astype(str), p["sampler"].astype(str), strict=True)
    ]
    g = p.assign(label=label, request=p["request"].astype(str))
    sums = g.groupby(["request", "label"])["ns"].sum().sort_values(ascending=False)
    out: dict[str, tuple[str, int]] = {}
    for (rid, name), ns in sums.items():
        out.setdefault(str(rid), (str(name), int(ns)))
    return out


def host_rows(f: SessionFrames) -> list[HostRow]:
    """The host's parts between the target's steps, each with when its sequence's window began
    ([] for a log without them): what names a sampler or the grammar as a late token's cause."""
    parts, seqs = f.samplers, f.host_seqs
    if parts.empty or seqs.empty:
        return []
    keys = ["ctx", "step", "seq", "request"]
    when = seqs[[*keys, "t_start"]].astype({"request": object}).drop_duplicates(keys)
    p = parts[[*keys, "kind", "sampler", "ns"]].astype({"request": object})
    p = p[p["kind"].astype(str) != "backend"].merge(when, on=keys, how="inner")
    if "role" in f.steps:  # a speculating session: the target's windows
        draft = f.steps[f.steps["role"].astype(object) == "draft"][["ctx", "step"]]
        p = p.merge(draft.assign(_d=1), on=["ctx", "step"], how="left")
        p = p[p["_d"].isna()]
        # the draft's work inside the next batch's building is the draft's, not the program's
        d = draft_in_gaps(f)
        if not d.empty:
            p = p.merge(d[["ctx", "step", "draft_batch_ns"]], on=["ctx", "step"], how="left")
            batch = (p["kind"].astype(str) == "host") & (p["sampler"].astype(str) == "batch")
            less = p["draft_batch_ns"].fillna(0).where(batch & p["seq"].isna(), 0)
            p = p.assign(ns=(p["ns"] - less).clip(lower=0))
    seq = p["seq"].fillna(-1).astype("int64")
    return list(
        zip(
            p["t_start"].astype("int64").tolist(),
            seq.tolist(),
            p["kind"].astype(str).tolist(),
            p["sampler"].astype(str).tolist(),
            p["ns"].astype("int64").tolist(),
            strict=True,
        )
    )


def spec_line(t: SpecTotals) -> str:
    """A request's speculation in one line: what it drafted, what that took, and whether it paid."""
    acc = f" ({t.acceptance * 100:.0f} %)" if t.acceptance is not None else ""
    verdict = f": {t.verdict()}" if t.verdict() else " (not priced: no single-token target step)"
    return (
        f"speculation ({t.type or 'draft'}): {t.accepted:,} of {t.drafted:,} drafted tokens "
        f"accepted{acc} in {t.verify_steps:,} verify steps; draft {t.draft_ns / 1e6:,.0f} ms, "
        f"verify {t.verify_ns / 1e6:,.0f} ms, {t.rejected_ns / 1e6:,.0f} ms of it on rejected "
        f"tokens{verdict}"
    )


def tasks_line(s: RequestStory) -> str:
    """A request of several tasks (several prompts, or ``n_cmpl`` completions of one) in one
    line: each task's slot and generated tokens, which add up to the request's."""
    first = s.gen_tokens - sum(k["gen_tokens"] for k in s.tasks)
    parts = [f"{s.id} on slot {s.slot}: {first:,}"]
    for k in s.tasks:
        of = f", a further completion of {k['parent']}" if k["parent"] else ""
        where = f"slot {k['slot']}" if k["slot"] is not None else "no slot"
        parts.append(f"{k['id']} (index {k['index']}{of}) on {where}: {k['gen_tokens']:,}")
    return f"{len(s.tasks) + 1} tasks, {s.gen_tokens:,} tokens generated in all: " + "; ".join(
        parts
    )


def _why(s: RequestStory, spec: SpecTotals | None = None) -> list[dict[str, Any]]:
    """The lines that say why ``s`` took its time: its split, its prompt cache, its
    speculation, its late tokens."""
    lines = [
        f"{s.total_ns / 1e6:,.0f} ms: queue {s.queue_ns / 1e6:,.0f}, prompt "
        f"{s.prompt_ns / 1e6:,.0f}, generation {s.generation_ns / 1e6:,.0f}, stream "
        f"{s.stream_ns / 1e6:,.0f}"
    ]
    if s.media is not None:
        lines.append(s.media.cause(s.id))
    if s.cache_note:
        lines.append(f"prompt cache: {s.cache_note}")
    if s.tasks:
        lines.append(tasks_line(s))
    if spec is not None:
        lines.append(spec_line(spec))
    lines += [t.cause for t in s.late_tokens]
    return [{"id": s.id if i == 0 else "", "why": line} for i, line in enumerate(lines)]


def section(
    items: list[RequestStory],
    top: int | None = None,
    spec: dict[str, SpecTotals] | None = None,
    samplers: dict[str, tuple[str, int]] | None = None,
) -> Section:
    """The requests, slowest first, and why the slowest were slow; ``spec``: each speculating
    request's drafts (``analysis.spec_split.totals``), by id; ``samplers``: each request's
    costliest sampler (``costliest_samplers``)."""
    spec, samplers = spec or {}, samplers or {}
    rows = [
        {**s.row(), "late": len(s.late_tokens), **_spec_cols(spec.get(s.id))}
        | ({"top_sampler": _sampler_text(samplers.get(s.id))} if samplers else {})
        | (s.media.row() if s.media is not None else {})
        for s in items
    ]
    media = any(s.media is not None for s in items)
    why = [line for s in items[: top or EXPLAINED] for line in _why(s, spec.get(s.id))]
    charted = items[:CHARTED]
    chart = Chart(
        name="request_split",
        kind="stacked",
        title=f"Where the slowest {len(charted)} requests' time went",
        x_label="ms",
        y_label="request",
        categories=[s.id for s in charted],
        series=[
            Series(label, [getattr(s, attr) / 1e6 for s in charted])
            for label, attr in (
                ("queue", "queue_ns"),
                ("prompt", "prompt_ns"),
                ("generation", "generation_ns"),
                ("stream", "stream_ns"),
            )
        ],
        value_fmt="f1",
    )
    return Section(
        "Why requests were slow",
        charts=[chart],
        facts=[
            Fact("requests", len(items), "int"),
            Fact(
                "prompts that reused less than a cache held",
                sum(1 for s in items if s.cache_miss_reason not in (None, "new")),
                "int",
            ),
            Fact("requests with late tokens", sum(1 for s in items if s.late_tokens), "int"),
        ],
        tables=[
            Table(
                "slowest",
                "The slowest, and why",
                [Column("id", "request"), Column("why", "why")],
                why,
                whole=True,
            ),
            Table(
                "requests",
                "Requests, slowest first",
                COLUMNS
                + (MEDIA_COLUMNS if media else [])
                + (SPEC_COLUMNS if spec else [])
                + ([SAMPLER_COLUMN] if samplers else []),
                rows,
            ),
        ],
    )


EXPERT_COLUMNS = [
    Column("id", "request"),
    Column("steps", "steps routed", "int"),
    Column("shared_steps_not_split", "shared steps (not split)", "int"),
    Column("experts_used_per_layer", "experts used per layer", "f2"),
    Column("hottest", "hottest layer:expert (share of the layer's tokens)"),
]


def experts_by_request(f: SessionFrames) -> dict[str, RequestExperts]:
    """A mixture of experts' routing per request ({} without routing records)."""
    ex = f.experts
    if ex.empty or not f.info.requests:
        return {}
    routed: dict[int, StepRouting] = {}
    for step, layer, e, t in ex[["step", "layer", "expert", "tokens"]].itertuples(False):
        routed.setdefault(int(step), []).append((int(layer), int(e), int(t)))
    n_expert = max(int(ex.attrs.get("n_expert", 0)), int(ex["expert"].max()) + 1)
    return request_experts(f.info.requests, indexed_step_rows(f), routed, n_expert)


def experts_section(items: list[RequestStory], experts: dict[str, RequestExperts]) -> Section:
    """Per request, slowest first: the experts its own steps routed to."""
    rows = []
    for s in items:
        x = experts.get(s.id)
        if x is None:
            continue
        hot = ", ".join(f"{la}:{e} ({100 * sh:.0f}%)" for la, e, sh in x.hottest())
        rows.append({"id": s.id, **x.row(), "hottest": hot})
    return Section(
        "Experts per request",
        tables=[Table("request_experts", "Experts per request", EXPERT_COLUMNS, rows)],
        text=(
            "from the routing of the steps whose batch carried the request's tokens alone; a "
            "step shared with other requests has the batch's routing, not split between them"
        ),
    )


def spec_by_id(f: SessionFrames, price: Any = None) -> dict[str, SpecTotals]:
    """Each speculating request's drafts, by id ({} for a session that did not speculate);
    ``price``: as ``analysis.spec_split.totals`` takes it."""
    from ..analysis.spec_split import totals  # (pandas: with the frames)

    t = totals(f, price)
    return {r.id: r for r in t[1]} if t else {}


def _sampler_text(top: tuple[str, int] | None) -> str | None:
    return f"{top[0]} {top[1] / 1e6:,.2f}" if top is not None else None


def _spec_cols(t: SpecTotals | None) -> dict[str, Any]:
    if t is None:
        return {}
    r = t.row()
    return {k: r[k] for k in ("drafted", "accepted", "acceptance", "saved_ms", "verdict")} | {
        "speculation": r
    }


def requests_report(f: SessionFrames, top: int | None = None, spec_price: Any = None) -> Report:
    """``instr requests``: every request, slowest first, and why; speculating, whether each one's
    drafts paid (``spec_price`` as ``summary_report`` takes it); for a mixture of experts with its
    routing recorded, the experts each one's steps routed to."""
    items = request_stories(f)
    spec = spec_by_id(f, spec_price)
    experts = experts_by_request(f)
    samplers = costliest_samplers(f)
    rows = []
    for s in items:
        row = {**s.row(), **_spec_cols(spec.get(s.id))}
        if samplers:
            name, ns = samplers.get(s.id) or (None, None)
            row["costliest_sampler"] = {"name": name, "ms": ns / 1e6 if ns is not None else None}
        if experts:
            x = experts.get(s.id)
            row["experts"] = x.row() if x is not None else None
        rows.append(row)
    sections = [section(items, top, spec, samplers)] if items else []
    if items and experts:
        sections.append(experts_section(items, experts))
    return Report(
        title=f"Requests of session {f.info.sid}",
        subtitle=f"{len(items)} requests" if items else "no request records in this log",
        sections=sections,
        data={"requests": rows},
        csv_table="requests",
    )
