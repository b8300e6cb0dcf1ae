"""Why a request was slow: its time split into queue, prompt, generation and stream, what its
prompt cache reused (and why not more), and which of its tokens came late and what shared their
batches.

A request record says when it arrived, waited, got its first token, let its slot go and was done
(docs/schema.md, ``request``); llama-server's adds its ``slot`` and its
``cache`` object, what the slot's cache held when the prompt began. The steps say which sequences
each batch carried and how many tokens of each (``seqs``): a slot's tokens are its request's
while it held the slot (``requests.slot_window``). Everything here is derived from those records;
nothing is estimated.

A token's arrival is the end of the step that produced it: the first at the end of the prompt's
last step, each next one at the end of the next step that carried the request's sequence. A token
is late when the gap since the one before is longer than the request's median gap by half of it
(and by at least a millisecond); its cause is what else the steps of that gap carried: another
slot's prompt chunk (a prefill), other slots' tokens, or nothing (the step itself was slow). With
speculative decoding, a request's steps are its target's (a verify step gives the tokens it
accepted at once), and a gap its draft's steps took half of, at least, is the draft's. Where the
log records the host's work between steps (``host`` records, DETAILED), a sampler, a grammar pass
or a part of the program's own work that took half of the token's lateness, at least, is named as
its cause ("the grammar's full pass took 71 ms").
"""

from __future__ import annotations

import statistics
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .cache_media import Parting
from .request_media import RequestMedia
from .requests import all_tokens, slot_window, task_windows

# (start ns, duration ns, the batch's tokens, [(sequence, its tokens)])
StepRow = tuple[int, int, int, list[tuple[int, int]]]
# a part of the host's work between two steps: (when its window began (ns), its sequence (-1:
# none in particular), kind, name, ns), as ``host`` records give them
HostRow = tuple[int, int, str, str, int]

LATE_SHOWN = 3  # the slowest gaps explained per request
LATE_MIN_NS = 1_000_000  # a gap this much over the median, at least, to count as late
# a cache that shared fewer tokens than this with a prompt shared its first words, no more: a
# template's head ("<|im_start|>system") is not a prompt the cache could have saved
MIN_SHARED = 16

# why a prompt reused less than it could: the names of `cache_miss_reason`
MISS_REASONS = {
    "disabled": "the request turned the prompt cache off (cache_prompt: false)",
    "sliding_window": "its slot held the prefix, but the model's memory (sliding window or "
    "recurrent) could not reuse it",
    "another_slot": "another slot's cache held more of the prompt",
    "template_drift": "the prompt continued the slot's conversation but its earlier text differed",
    "evicted": "an earlier request's prompt began the same, and no cache held it any more",
    "diverged": "the prompt differed from what the slot's cache held",
    "new": "no cache held any of it",
}


@dataclass
class LateToken:
    token: int  # 1: the request's first generated token
    t: int  # when it arrived (ns, the log's clock)
    gap_ns: int  # since the token before
    late_ns: int  # over the request's median gap
    cause: str  # what shared the steps of the gap, in words
    shared: list[dict[str, Any]] = field(default_factory=list)  # {request, slot, tokens, prefill}
    host_part: str | None = None  # "kind:name" of the host's part that took the gap, if one did

    def row(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "t": self.t,
            "gap_ms": self.gap_ns / 1e6,
            "late_ms": self.late_ns / 1e6,
            "cause": self.cause,
            "shared_with": self.shared,
            "host_part": self.host_part,
        }


@dataclass
class RequestStory:
    id: str
    outcome: str
    slot: int | None
    prompt_tokens: int
    gen_tokens: int
    total_ns: int
    queue_ns: int  # arrival until its slot began the prompt
    prompt_ns: int  # until the first token
    generation_ns: int  # until the slot let it go
    stream_ns: int  # until the response was done
    cache_reused_tokens: int | None
    cache_miss_reason: str | None
    cache_note: str
    late_tokens: list[LateToken]
    # its tasks after its first (llama-server: its other prompts, n_cmpl's further completions),
    # each as ``task_row`` gives it; its prompt and generated tokens above are all its tasks'
    tasks: list[dict[str, Any]] = field(default_factory=list)
    # its images' or sounds' encodes and prefill, beside its text's (``request_media``)
    media: RequestMedia | None = None
    # the image or sound each side had where its prompt parted from its slot's cache
    cache_media: Parting | None = None

    def row(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "outcome": self.outcome,
            "slot": self.slot,
            "total_ms": self.total_ns / 1e6,
            "queue_ms": self.queue_ns / 1e6,
            "prompt_ms": self.prompt_ns / 1e6,
            "generation_ms": self.generation_ns / 1e6,
            "stream_ms": self.stream_ns / 1e6,
            "prompt_tokens": self.prompt_tokens,
            "gen_tokens": self.gen_tokens,
            "cache_reused_tokens": self.cache_reused_tokens,
            "cache_miss_reason": self.cache_miss_reason,
            "cache_note": self.cache_note,
            "late_tokens": [t.row() for t in self.late_tokens],
            "tasks": self.tasks,
            **({"media": self.media.row()} if self.media is not None else {}),
            **({"cache_media": self.cache_media.row()} if self.cache_media is not None else {}),
        }


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def split(rec: dict[str, Any]) -> tuple[int, int, int, int, int]:
    """Total, queue, prompt, generation and stream time (ns) of a request record: consecutive
    parts of its total, each from the record's own times (a part it never reached is 0). Its
    generation runs until the last of its tasks let its slot go."""
    total = max(_int(rec.get("dur")) or 0, 0)
    wait, ttft, model = _int(rec.get("wait")), _int(rec.get("ttft")), _int(rec.get("model"))
    if wait is None:  # never reached the model: all of it was the queue
        return total, total, 0, 0, 0
    queue = max(wait, 0)
    first = max(ttft, queue) if ttft is not None else None
    held = queue + max(model, 0) if model is not None else total
    for k in rec.get("tasks") or ():
        k_wait, k_model = _int(k.get("wait")), _int(k.get("model"))
        if k_wait is not None and k_model is not None:
            held = max(held, min(k_wait + k_model, total))
    prompt = (first if first is not None else held) - queue
    generation = held - first if first is not None else 0
    return total, queue, max(prompt, 0), max(generation, 0), max(total - held, 0)


def _diverged_words(div: dict[str, Any], parting: Parting | None) -> str:
    """Where the cache and the prompt parted, in words: the text before, and each side's text
    after, or the image or sound it had there (``cache_media``), which its text ("[media]")
    does not tell apart."""
    held: str = repr(str(div.get("held", "")))
    prompt: str = repr(str(div.get("prompt", "")))
    verdict = ""
    if parting is not None:
        held = parting.held.words() if parting.held is not None else held
        prompt = parting.prompt.words() if parting.prompt is not None else prompt
        verdict = f": {parting.verdict()}" if parting.verdict() else ""
    return (
        f" at token {_int(div.get('at')) or 0:,}, after {str(div.get('before', ''))!r}: "
        f"the cache had {held}, the prompt {prompt}{verdict}"
    )


def cache_reason(cache: Any, parting: Parting | None = None) -> tuple[int | None, str | None, str]:
    """Tokens the prompt reused, why not more (a MISS_REASONS key, or None when it reused all it
    could) and a line saying so, from a request record's ``cache`` object; ``parting``: the media
    each side had where they diverged (``cache_media.partings``)."""
    if not isinstance(cache, dict):
        return None, None, ""
    n = _int(cache.get("prompt")) or 0
    reused = max(_int(cache.get("reused")) or 0, 0)
    common = _int(cache.get("common")) or 0
    held = _int(cache.get("held")) or 0
    other = _int(cache.get("other_common")) or 0
    seen: dict[str, Any] = cache["seen"] if isinstance(cache.get("seen"), dict) else {}
    seen_n = _int(seen.get("tokens")) or 0
    div: dict[str, Any] | None = (
        cache["diverged"] if isinstance(cache.get("diverged"), dict) else None
    )
    head = f"reused {reused:,} of {n:,} prompt tokens"
    # the server decodes at least the prompt's last token, whatever it held
    if reused >= n - 1:
        return reused, None, head
    around = _diverged_words(div, parting) if div is not None else ""
    chosen = f" (the server chose this one by {cache['slot_by']})" if cache.get("slot_by") else ""
    if cache.get("enabled") is False:
        reason, why = "disabled", MISS_REASONS["disabled"]
    elif common > reused + 1:
        reason = "sliding_window"
        why = (
            f"its slot held {common:,} of them, but the model's memory (sliding window or "
            "recurrent) could not reuse them"
        )
    elif other >= max(common, reused) + MIN_SHARED:
        reason, why = (
            "another_slot",
            f"slot {cache.get('other_slot')} held {other:,} of them{chosen}",
        )
    elif div is not None and n > held and common >= MIN_SHARED:
        reason, why = (
            "template_drift",
            f"it continued the slot's {held:,} tokens but differed{around}",
        )
    elif seen_n >= reused + MIN_SHARED:
        who = seen.get("request")
        reason, why = (
            "evicted",
            f"{who} had at least {seen_n:,} of them; no cache held them any more",
        )
    elif div is not None and common >= MIN_SHARED:
        reason, why = "diverged", f"the prompt differed from its slot's cache{around}"
    else:
        reason, why = "new", MISS_REASONS["new"]
    return reused, reason, f"{head}: {why}"


class _StepIndex:
    """The session's steps (in time order) found by when they began and when they ended, so that
    a request's steps and a gap's are a bisection each, not a pass over every step of the log."""

    def __init__(self, rows: Sequence[StepRow]) -> None:
        self.rows = rows
        self.starts = [r[0] for r in rows]
        by_end = sorted(range(len(rows)), key=lambda i: rows[i][0] + rows[i][1])
        self.by_end = by_end
        self.ends = [rows[i][0] + rows[i][1] for i in by_end]
        # the steps' durations summed in the order of their ends (a gap's busy time at once)
        self.busy = [0]
        for i in by_end:
            self.busy.append(self.busy[-1] + rows[i][1])

    def ended_span(self, a: int, b: int) -> tuple[int, int]:
        """Where the steps that ended after ``a`` and by ``b`` lie in ``by_end``."""
        return bisect_right(self.ends, a), bisect_right(self.ends, b)

    def ended(self, a: int, b: int, limit: int | None = None) -> list[StepRow]:
        """The steps that ended after ``a`` and by ``b`` (the first ``limit`` of them by end), in
        time order."""
        lo, hi = self.ended_span(a, b)
        if limit is not None:
            hi = min(hi, lo + limit)
        return [self.rows[i] for i in sorted(self.by_end[lo:hi])]


class _HostIndex:
    """The host's parts between steps, by when their window began, for a gap's in a bisection."""

    def __init__(self, rows: Sequence[HostRow]) -> None:
        self.rows = sorted(rows, key=lambda r: r[0])
        self.starts = [r[0] for r in self.rows]

    def costliest(self, a: int, b: int, slot: int) -> tuple[str, str, int] | None:
        """Of the parts of windows that began from ``a`` to before ``b``, for ``slot`` or for no
        sequence in particular, the (kind, name) that took most, with its ns summed."""
        lo, hi = bisect_right(self.starts, a - 1), bisect_right(self.starts, b - 1)
        sums: dict[tuple[str, str], int] = {}
        for _, seq, kind, name, ns in self.rows[lo : min(hi, lo + GAP_PARTS_READ)]:
            if seq in (slot, -1):
                sums[(kind, name)] = sums.get((kind, name), 0) + ns
        if not sums:
            return None
        (kind, name), ns = max(sums.items(), key=lambda x: x[1])
        return kind, name, ns


# the parts a gap's windows are read for at most (a gap of more is a damaged log's)
GAP_PARTS_READ = 65536
GRAMMAR_PASSES = {
    "check": "the grammar's check of the sampled token",
    "full": "the grammar's full pass",
    "accept": "the grammar's accept",
}


def host_part_words(kind: str, name: str) -> str:
    """A part of the host's work between steps in words: "the grammar's full pass", "sampler
    penalties", "the program's stop"."""
    if kind == "grammar":
        return GRAMMAR_PASSES.get(name, f"the grammar's {name}")
    if kind == "sampler":
        return "the grammar" if name.lstrip("?+") == "grammar" else f"sampler {name}"
    if kind == "sampling":
        return "building the candidates" if name == "candidates" else f"sampling's {name}"
    return f"the program's {name}"


class _Windows:
    """When each request held its slot (``requests.slot_window``), to say who held a slot at a
    time in a bisection: of the windows of the slot begun by then, the one that lasts longest
    (a log's windows of one slot do not overlap: the one that holds the time)."""

    def __init__(self) -> None:
        self.raw: dict[int, list[tuple[int, int, int]]] = {}  # slot -> (t0, t1, request index)
        self.t0s: dict[int, list[int]] = {}
        self.longest: dict[int, list[tuple[int, int]]] = {}  # prefix max of (t1, -index)

    def add(self, slot: int, t0: int, t1: int, k: int) -> None:
        self.raw.setdefault(slot, []).append((t0, t1, k))

    def close(self) -> None:
        for slot, ws in self.raw.items():
            ws.sort(key=lambda w: w[0])
            self.t0s[slot] = [w[0] for w in ws]
            best: list[tuple[int, int]] = []
            for _t0, t1, k in ws:
                best.append(max(best[-1], (t1, -k)) if best else (t1, -k))
            self.longest[slot] = best

    def holder(self, slot: int, t: int) -> int | None:
        """The index of the request that held ``slot`` at ``t``; None when none did."""
        t0s = self.t0s.get(slot)
        if not t0s:
            return None
        i = bisect_right(t0s, t) - 1
        if i < 0:
            return None
        t1, k = self.longest[slot][i]
        return -k if t1 >= t else None


# the steps of a gap whose other slots are named (a gap of more is a damaged log's)
GAP_STEPS_SHOWN = 256


def _arrivals(rec: dict[str, Any], slot: int, mine: Sequence[StepRow]) -> list[int]:
    """When each of ``rec``'s tokens came: the end of the step that sampled it (the first, of
    the step its prompt's last tokens were in)."""
    prompt_left = max(_int(rec.get("prompt_tokens")) or 0, 1)
    arrivals: list[int] = []
    for start, dur, _, seqs in mine:
        n = sum(k for q, k in seqs if q == slot)
        if prompt_left > 0:
            prompt_left -= n
            if prompt_left <= 0:
                arrivals.append(start + dur)  # the first token: sampled after the prompt
        else:
            arrivals.append(start + dur)
    return arrivals


def _shared(index: _StepIndex, a: int, b: int, slot: int, who: Any) -> list[dict[str, Any]]:
    """The other slots' tokens in the steps that ended between ``a`` and ``b``, per slot and
    request, most tokens first."""
    others: dict[tuple[int, str], list[int]] = {}
    for start, _, _, seqs in index.ended(a, b, GAP_STEPS_SHOWN):
        for q, k in seqs:
            if q != slot:
                others.setdefault((q, who(q, start)), []).append(k)
    return [
        {"request": rid or None, "slot": q, "tokens": sum(ks), "prefill": max(ks) > 1}
        for (q, rid), ks in sorted(others.items(), key=lambda x: -sum(x[1]))
    ]


def _cause(
    head: str,
    gap: int,
    median: float,
    shared: list[dict[str, Any]],
    busy: int,
    drafting: int,
    n_drafts: int,
    part: tuple[str, str, int] | None,
) -> tuple[str, str | None]:
    """Why a gap of ``gap`` ns against the ``median`` one: the host's costliest part
    (``part``), a prefill in the same batch, the draft (``drafting`` ns in ``n_drafts`` steps),
    time outside the decode steps (``busy`` ns in them), other slots' tokens, or none of these;
    and the host's part (``KIND:NAME``) when it was that."""
    if part is not None and part[2] >= (gap - median) / 2:
        cause = f"{head}: {host_part_words(part[0], part[1])} took {part[2] / 1e6:,.0f} ms"
        return cause, f"{part[0]}:{part[1]}"
    prefill = [s for s in shared if s["prefill"]]
    if prefill:
        s = prefill[0]
        what = f" of {s['request']}" if s["request"] else ""
        return (
            f"{head}: slot {s['slot']} was prefilling {s['tokens']:,} tokens{what} "
            f"in the same batch"
        ), None
    if drafting >= gap / 2:
        return (
            f"{head}: the draft took {drafting / 1e6:,.0f} ms of the gap in {n_drafts} "
            f"step{'s' * (n_drafts != 1)}; the target's took {busy / 1e6:,.0f} ms"
        ), None
    if busy + drafting < gap / 2:
        return f"{head}: {(gap - busy) / 1e6:,.0f} ms of the gap was outside decode steps", None
    if shared:
        n = sum(s["tokens"] for s in shared)
        many = f"{n:,} token{'s' * (n != 1)} of {len(shared)} other slot{'s' * (len(shared) != 1)}"
        return f"{head}: its batch also carried {many}", None
    return (
        f"{head}: nothing else shared its batch; the step took {busy / 1e6:,.0f} ms "
        f"against a median gap of {median / 1e6:,.0f} ms"
    ), None


def _late(
    rec: dict[str, Any],
    slot: int,
    mine: Sequence[StepRow],
    index: _StepIndex,
    who: Any,
    draft: _StepIndex | None = None,
    host: _HostIndex | None = None,
) -> list[LateToken]:
    """``rec``'s late tokens, from ``mine``: the steps of its slot in its window, in time order.
    ``who(slot, t)``: the id of the request that held ``slot`` at ``t`` ("" when none did)."""
    arrivals = _arrivals(rec, slot, mine)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    if len(gaps) < 2:
        return []
    median = statistics.median(gaps)
    late = sorted(
        (i for i, g in enumerate(gaps) if g - median >= max(median / 2, LATE_MIN_NS)),
        key=lambda i: -gaps[i],
    )[:LATE_SHOWN]
    out = []
    for i in late:
        a, b = arrivals[i], arrivals[i + 1]
        lo, hi = index.ended_span(a, b)
        n_steps, busy = hi - lo, index.busy[hi] - index.busy[lo]
        shared = _shared(index, a, b, slot, who)
        token = i + 2  # gaps[i] ends at arrivals[i + 1], the (i + 2)th token
        ms = (gaps[i] - median) / 1e6
        head = f"token {token} of {rec.get('id')} came {ms:,.0f} ms late"
        d_lo, d_hi = draft.ended_span(a, b) if draft is not None else (0, 0)
        drafting = draft.busy[d_hi] - draft.busy[d_lo] if draft is not None else 0
        part = host.costliest(a, b, slot) if host is not None else None
        cause, by_host = _cause(head, gaps[i], median, shared, busy, drafting, d_hi - d_lo, part)
        if n_steps > 1:
            cause += f" ({n_steps} steps in the gap)"
        if 0 < drafting < gaps[i] / 2:
            cause += f"; the draft took {drafting / 1e6:,.0f} ms of it"
        out.append(LateToken(token, b, gaps[i], int(gaps[i] - median), cause, shared, by_host))
    return out


def _own_steps(
    reqs: list[dict[str, Any]], rows: Sequence[StepRow]
) -> tuple[dict[int, list[StepRow]], _Windows]:
    """Each request's steps (by its index in ``reqs``): those of its slots (no slot: sequence 0)
    that began in their windows (its first task's, and its other tasks'), each step given to one
    request only, the one that held the slot then (``_Windows``), so that requests whose windows
    overlap (a damaged log's) cost no more than the log's steps; and the windows of the requests
    that name their slot."""
    named, every = _Windows(), _Windows()
    for k, r in enumerate(reqs):
        slot = _int(r.get("slot"))
        try:
            t0, t1 = slot_window(r)
        except (KeyError, TypeError, ValueError):
            continue
        every.add(slot if slot is not None else 0, t0, t1, k)
        if slot is not None:
            named.add(slot, t0, t1, k)
        for q, q0, q1 in task_windows(r):
            every.add(q, q0, q1, k)
            named.add(q, q0, q1, k)
    named.close()
    every.close()
    mine: dict[int, list[StepRow]] = {}
    for row in rows:
        # (a request whose tasks' sequences share the step has it once)
        holders = dict.fromkeys(every.holder(q, row[0]) for q, _ in row[3])
        for holder in holders:
            if holder is not None:
                mine.setdefault(holder, []).append(row)
    return mine, named


def task_row(k: dict[str, Any]) -> dict[str, Any]:
    """One of a request's tasks after its first, as ``instr requests`` gives it: its id, its
    place in the response (``index``), the task it is a further completion of (``parent``), its
    slot, tokens and times (ms from the request's arrival)."""
    ms = {}
    for t in ("wait", "ttft", "model"):
        v = _int(k.get(t))
        ms[f"{t}_ms"] = v / 1e6 if v is not None else None
    return {
        "id": k.get("id"),
        "index": _int(k.get("index")),
        "parent": k.get("parent"),
        "slot": _int(k.get("slot")),
        "prompt_tokens": _int(k.get("prompt_tokens")) or 0,
        "gen_tokens": _int(k.get("gen_tokens")) or 0,
        **ms,
    }


def stories(
    requests: Iterable[dict[str, Any]],
    rows: Sequence[StepRow],
    draft_rows: Sequence[StepRow] = (),
    host_rows: Sequence[HostRow] = (),
    partings: dict[str, Parting] | None = None,
) -> list[RequestStory]:
    """Each request record's story, slowest first. ``rows``: the session's steps in time order
    (a speculating session's: its target's; ``draft_rows``: its draft's); ``host_rows``: the
    host's parts between steps (a target's), when the log records them; ``partings``: by
    request, the media where its prompt parted from its slot's cache (``cache_media``)."""
    reqs = [r for r in requests if isinstance(r, dict)]
    index = _StepIndex(rows)
    draft = _StepIndex(draft_rows) if draft_rows else None
    host = _HostIndex(host_rows) if host_rows else None
    mine, windows = _own_steps(reqs, rows)

    def who(slot: int, t: int) -> str:
        """The request that held ``slot`` at ``t`` ("" when no record says)."""
        k = windows.holder(slot, t)
        return "" if k is None else str(reqs[k].get("id", ""))

    out = []
    for j, r in enumerate(reqs):
        total, queue, prompt, gen, stream = split(r)
        parting = (partings or {}).get(str(r.get("id", "")))
        reused, reason, note = cache_reason(r.get("cache"), parting)
        slot = _int(r.get("slot"))
        q = slot if slot is not None else 0
        # its first task's late tokens: the steps that carried that task's sequence
        first = [row for row in mine.get(j, []) if any(s == q for s, _ in row[3])]
        n_prompt, n_gen = all_tokens(r)
        out.append(
            RequestStory(
                id=str(r.get("id", "")),
                outcome=str(
                    r.get("outcome") or ("ok" if (_int(r.get("status")) or 0) < 400 else "error")
                ),
                slot=slot,
                prompt_tokens=n_prompt,
                gen_tokens=n_gen,
                total_ns=total,
                queue_ns=queue,
                prompt_ns=prompt,
                generation_ns=gen,
                stream_ns=stream,
                cache_reused_tokens=reused,
                cache_miss_reason=reason,
                cache_note=note,
                # no slot: a server of one sequence (instr serve), whose steps hold sequence 0
                late_tokens=_late(r, q, first, index, who, draft, host),
                tasks=[task_row(k) for k in r.get("tasks") or ()],
                cache_media=parting,
            )
        )
    out.sort(key=lambda s: (-s.total_ns, s.id))
    return out
