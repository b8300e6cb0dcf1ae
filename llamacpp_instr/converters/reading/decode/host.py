"""The host's work between a context's steps: ``host`` records (each output's sampling, every
sampler of the chain apart, and the program's own work, per sequence), ``chain`` records (a sampler
chain and llama.cpp's own counter of its time) and ``perf`` records (llama.cpp's own counters of a
context's decoding). Each is checked here once, its counts and tables bounded; a record without the
schema's shape raises one of ``fields.MALFORMED`` and is skipped as every damaged record is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fields import VALUE_MAX, uint

# What a part of a host record is (enum llama_instr_part_kind, in its order).
KINDS = ("sampler", "grammar", "sampling", "backend", "host")
MAX_SEQS = 256  # sequences a record keeps apart (the native side's bound)
MAX_PARTS = 16384  # parts a record holds at most (64 names for each of its sequences)
MAX_SAMPLERS = 64  # samplers a chain record names
NAME_MAX = 64  # characters of a name kept (the native side writes at most 31 bytes)
REQUEST_MAX = 256  # characters of a request id kept
# The pin's samplers by the names ``llama_sampler_name`` gives them, and ``custom`` for one without
# a name: what a sampler part's type may be where a label must stay bounded (``sampler_type``).
PIN_SAMPLERS = (
    "top-k", "top-p", "min-p", "temp", "temp-ext", "penalties", "dry", "typical", "xtc",
    "mirostat", "mirostat-v2", "logit-bias", "top-n-sigma", "adaptive-p", "infill", "grammar",
    "dist", "greedy", "custom",
)  # fmt: skip
SAMPLING_PARTS = ("candidates", "chain")  # the rest of the sampling the native side names
OTHER = "other"  # a name outside those above (a newer llama.cpp's, or a damaged log's)


def sampler_type(kind: str, name: str) -> str | None:
    """What a part of the sampling is, from a bounded set of names: one of ``PIN_SAMPLERS`` (a
    ``?`` or ``+`` before the name, a sampler its parameters made a no-op or one run on the
    backend, is the same sampler), ``grammar`` for the grammar's passes outside the chain, one of
    ``SAMPLING_PARTS``, or ``other``; None for what is not host sampling time (``backend``, whose
    time is the graph's, and ``host``, the program's own work)."""
    if kind == "grammar":
        return "grammar"
    if kind == "sampler":
        base = name.lstrip("?+")
        return base if base in PIN_SAMPLERS else OTHER
    if kind == "sampling":
        return name if name in SAMPLING_PARTS else OTHER
    return None


@dataclass(frozen=True)
class HostSeq:
    """One sequence's share of a host record."""

    seq: int  # -1: no sequence in particular (a token accepted outside any sampling)
    request: str | None
    sampled: int  # outputs sampled
    sample_ns: int  # the sampling scopes, end to end
    chain_ns: int  # of which in the sampler chain (what llama_perf_sampler counts)
    host_ns: int  # the program's own work
    start_off: int  # its first and last recorded instants, ns from the record's t_start
    end_off: int


@dataclass(frozen=True)
class HostPart:
    """A sampler, a grammar pass or a piece of the program's work, summed over the record for one
    of its sequences (and the request it served)."""

    row: int  # the record's ``seqs`` row it belongs to
    seq: int
    request: str | None
    kind: str  # one of KINDS
    name: str
    ns: int
    n: int  # times it ran


@dataclass(frozen=True)
class HostWork:
    """One ``host`` record: what a context's host did after step ``step``, before its next."""

    ctx: int
    step: int
    level: str
    t_start: int
    dur: int
    sampled: int
    sample_ns: int
    chain_ns: int
    host_ns: int
    cpu_ns: int | None  # the decoding thread's CPU time from the step's end to the next's start
    seqs: tuple[HostSeq, ...]  # detailed and above
    parts: tuple[HostPart, ...]  # detailed and above
    dropped: int  # parts past the native side's bounds (their time is in the totals)


@dataclass(frozen=True)
class Chain:
    """One ``chain`` record: a sampler chain and llama.cpp's own counters of it."""

    ctx: int
    seq: int
    request: str | None
    samplers: tuple[str, ...]
    t_sample_us: int  # llama_perf_sampler(chain).t_sample_ms * 1000
    n_sample: int


@dataclass(frozen=True)
class ContextPerf:
    """One ``perf`` record: llama.cpp's own counters of a context (llama_perf_context)."""

    ctx: int
    t_p_eval_us: int
    n_p_eval: int
    t_eval_us: int
    n_eval: int
    n_reused: int


def _seq(v: Any) -> int:
    if type(v) is not int or not -1 <= v < VALUE_MAX:
        raise ValueError(f"sequence {v!r}")
    return v


def _text(v: Any, what: str, limit: int) -> str:
    if type(v) is not str:
        raise TypeError(f"{what} is not a string")
    return v[:limit]


def _rows(rec: dict[str, Any], key: str, width: int, limit: int) -> list[list[Any]]:
    raw = rec.get(key, [])
    if type(raw) is not list or len(raw) > limit:
        raise ValueError(f"{key} is not a list of at most {limit}")
    for row in raw:
        if type(row) is not list or len(row) != width:
            raise ValueError(f"a {key} row is not a list of {width} values")
    return raw


def host_record(rec: dict[str, Any]) -> HostWork:
    """A ``host`` record, checked: counts and times integers from 0 to below 2**62, each sequence's
    instants within the record's span, at most ``MAX_SEQS`` sequences and ``MAX_PARTS`` parts, each
    part of a known kind."""
    dur = uint(rec["dur"])
    seqs = []
    for seq, request, *counts in _rows(rec, "seqs", 8, MAX_SEQS):
        sampled, sample_ns, chain_ns, host_ns, start_off, end_off = (uint(x) for x in counts)
        if not start_off <= end_off <= dur:
            raise ValueError(f"a sequence's span [{start_off}, {end_off}] is outside the record's")
        seqs.append(
            HostSeq(
                seq=_seq(seq),
                request=None if request is None else _text(request, "request", REQUEST_MAX),
                sampled=sampled,
                sample_ns=sample_ns,
                chain_ns=chain_ns,
                host_ns=host_ns,
                start_off=start_off,
                end_off=end_off,
            )
        )
    parts = []
    for row, kind, name, ns, n in _rows(rec, "parts", 5, MAX_PARTS):
        if type(row) is not int or not 0 <= row < len(seqs):
            raise ValueError(f"a part's row {row!r} is not one of the {len(seqs)} of seqs")
        if kind not in KINDS:
            raise ValueError(f"part kind {kind!r}")
        q = seqs[row]
        name = _text(name, "a part's name", NAME_MAX)
        parts.append(HostPart(row, q.seq, q.request, kind, name, uint(ns), uint(n)))
    level = rec["level"]
    if type(level) is not str:
        raise TypeError("level is not a string")
    return HostWork(
        ctx=uint(rec["ctx"], 1),
        step=uint(rec["step"]),
        level=level[:16],
        t_start=uint(rec["t_start"]),
        dur=dur,
        sampled=uint(rec["sampled"]),
        sample_ns=uint(rec["sample_ns"]),
        chain_ns=uint(rec["chain_ns"]),
        host_ns=uint(rec["host_ns"]),
        cpu_ns=None if rec.get("cpu_ns") is None else uint(rec["cpu_ns"]),
        seqs=tuple(seqs),
        parts=tuple(parts),
        dropped=uint(rec.get("dropped", 0)),
    )


def chain_record(rec: dict[str, Any]) -> Chain:
    """A ``chain`` record, checked (at most ``MAX_SAMPLERS`` names)."""
    names = rec["samplers"]
    if type(names) is not list or len(names) > MAX_SAMPLERS:
        raise ValueError(f"samplers is not a list of at most {MAX_SAMPLERS}")
    request = rec.get("request")
    return Chain(
        ctx=uint(rec["ctx"], 1),
        seq=_seq(rec["seq"]),
        request=None if request is None else _text(request, "request", REQUEST_MAX),
        samplers=tuple(_text(x, "a sampler's name", NAME_MAX) for x in names),
        t_sample_us=uint(rec["t_sample_us"]),
        n_sample=uint(rec["n_sample"]),
    )


def perf_record(rec: dict[str, Any]) -> ContextPerf:
    """A ``perf`` record, checked."""
    return ContextPerf(
        ctx=uint(rec["ctx"], 1),
        t_p_eval_us=uint(rec["t_p_eval_us"]),
        n_p_eval=uint(rec["n_p_eval"]),
        t_eval_us=uint(rec["t_eval_us"]),
        n_eval=uint(rec["n_eval"]),
        n_reused=uint(rec["n_reused"]),
    )
