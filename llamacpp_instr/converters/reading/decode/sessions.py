"""session_start records (``SessionInfo``), and the events a fold of a log yields."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import orjson

from .fields import VALUE_MAX, as_dict, nonneg, opt_count
from .host import Chain, ContextPerf, HostWork
from .media import Encode, MediaTable
from .memory import Allocation
from .spec import MAX_POS, Verify
from .steps import Step
from .transfers import Transfers


@dataclass
class SessionInfo:
    """Everything session_start says, plus what the end says once known."""

    sid: str
    start_ts: int
    wall_time: str
    level: str
    schema_version: int
    producer: dict[str, Any]
    metadata: dict[str, Any]
    model: dict[str, Any]
    context: dict[str, Any]
    weights: list[dict[str, Any]]
    memory: dict[str, Any]
    end: dict[str, Any] | None = None
    last_ts: int = 0
    # `request` records (instr serve), in log order
    requests: list[dict[str, Any]] = field(default_factory=list)
    # `part` records (llama-bench's tests), in log order
    parts: list[dict[str, Any]] = field(default_factory=list)
    # `transfers` records outside any step (the model's upload: ``load``; ``between``), in log
    # order (a step's own are its ``Step.transfers``)
    transfers: list[Transfers] = field(default_factory=list)
    # the machine that made the log (CPU model, devices), {} in logs from before it was recorded
    machine: dict[str, Any] = field(default_factory=dict)
    # always on: sampling ({"steps": N, "requests": M}, {} when every step is recorded at the
    # level), rotation ({"max_bytes", "keep"}); a rotated log read alone or from a later file
    # says which file of the session it starts at (0: the first), and how many files were read
    sample: dict[str, Any] = field(default_factory=dict)
    rotate: dict[str, Any] = field(default_factory=dict)
    first_file: int = 0
    files: int = 1
    # every backend buffer the log saw, by id in the order made (memory_alloc, with memory_free's
    # time once freed), and the allocations that failed (memory_alloc_failed's fields)
    allocations: dict[int, Allocation] = field(default_factory=dict)
    memory_failures: list[dict[str, Any]] = field(default_factory=list)
    # llama-server's speculative decoding: each context's model and role (``context`` records,
    # by ctx), and each verify step of a slot (``spec`` records), in log order
    contexts: dict[int, dict[str, Any]] = field(default_factory=dict)
    verifies: list[Verify] = field(default_factory=list)
    # each sampler chain with llama.cpp's own counter of its time (``chain`` records), and each
    # context's counters of its decoding (``perf``), in log order; the host's work between steps
    # comes as ``HostDone`` events, one per ``host`` record
    chains: list[Chain] = field(default_factory=list)
    perf: list[ContextPerf] = field(default_factory=list)
    # images and sounds mtmd tokenized (``media`` records), in log order, as columns (at most
    # ``media.MAX_MEDIA``, the rest counted)
    media: MediaTable = field(default_factory=MediaTable)

    @property
    def ended(self) -> bool:
        return self.end is not None

    @property
    def title(self) -> str:
        name = str(self.model.get("name") or self.model.get("architecture") or "model")
        ftype = str(self.model.get("file_type", ""))
        return f"{name} {ftype} [{self.sid}]".replace("  ", " ")


@dataclass
class SessionStarted:
    session: SessionInfo


@dataclass
class StepDone:
    """A decode step ended (or its session did before it: ``step.ended`` False)."""

    session: SessionInfo
    step: Step


@dataclass
class EncodeDone:
    """An encoder's encode ended (or its session did before it: ``encode.ended`` False)."""

    session: SessionInfo
    encode: Encode


@dataclass
class HostDone:
    """A ``host`` record: what a context's host did after one of its steps (read after that step's
    own records, with the context's next step)."""

    session: SessionInfo
    host: HostWork


@dataclass
class SessionEnded:
    session: SessionInfo


Event = SessionStarted | StepDone | EncodeDone | HostDone | SessionEnded


def session_info(rec: dict[str, Any]) -> SessionInfo:
    memory = as_dict(rec.get("memory"))
    return SessionInfo(
        sid=str(rec["sid"]),
        start_ts=nonneg(rec["ts"]),
        wall_time=str(rec.get("wall_time", "")),
        level=str(rec.get("level", "")),
        schema_version=int(rec.get("schema_version", 1)),
        producer=as_dict(rec.get("producer")),
        metadata=as_dict(rec.get("metadata")),
        model=as_dict(rec.get("model")),
        context=as_dict(rec.get("context")),
        weights=weight_rows(rec.get("weights")),
        # totals must be numbers; per-buffer rows are kept as given
        memory={k: (int(v) if k != "buffers" else v) for k, v in memory.items()},
        last_ts=nonneg(rec["ts"]),
        machine=as_dict(rec.get("machine")),
        sample=as_dict(rec.get("sample")),
        rotate=as_dict(rec.get("rotate")),
        first_file=int(as_dict(rec.get("file")).get("index", 0)),
    )


def _weight(w: Any) -> dict[str, Any] | None:
    """A ``weights`` entry as the tables read it (its ``layer`` None when it has none), or None if
    it lacks one of their fields or holds one of another type."""
    if not isinstance(w, dict):
        return None
    shape = w.get("shape")
    layer = w.get("layer")
    type_id = w.get("type_id", -1)
    if not (
        type(w.get("name")) is str
        and type(w.get("type")) is str
        and type(w.get("buffer")) is str
        and type(shape) is list
        and len(shape) <= 4
        and all(type(d) is int and 0 <= d < VALUE_MAX for d in shape)
        and (layer is None or type(layer) is int)
        and type(type_id) is int
    ):
        return None
    try:
        opt_count(w.get("n_elements", 0))
        opt_count(w.get("bytes", 0))
    except (TypeError, ValueError):
        return None
    return w if "layer" in w else {**w, "layer": None}


def weight_rows(raw: Any) -> list[dict[str, Any]]:
    """A session_start's ``weights``: the entries the tables can read (the others left out)."""
    if type(raw) is not list:
        return []
    return [w for w in map(_weight, raw) if w is not None]


# a request record's fields that are counts or times (ns), each an integer from 0 to below 2**62
# when present; ``t_arrive`` must be
REQUEST_COUNTS = (
    "ts",
    "wait",
    "ttft",
    "model",
    "dur",
    "slot",
    "status",
    "prompt_tokens",
    "gen_tokens",
    "tokens_sent",
    "last_token",
    "send_ns",
    "sends",
)
REQUEST_TEXTS = ("id", "endpoint", "method", "outcome", "error", "traceparent", "level")
# llama-server's ``spec`` object in a request record: its counts and times
REQUEST_SPEC_COUNTS = (
    "drafted",
    "accepted",
    "verify_steps",
    "draft_ns",
    "verify_ns",
    "rejected_ns",
)


# llama-server's ``cache`` object in a request record: its counts, and its texts (at most
# CACHE_TEXT_MAX characters each are kept: the server writes at most 120 bytes)
CACHE_COUNTS = ("prompt", "held", "common", "reused", "other_slot", "other_common")
CACHE_TEXT_MAX = 512
# a part record's texts, at most (llama-bench's test names)
PART_TEXT_MAX = 256
# a part record's samples, at most (llama-bench's repetitions of a test)
PART_SAMPLES_MAX = 1 << 16


def _text(v: Any, name: str, limit: int) -> str:
    if type(v) is not str:
        raise TypeError(f"{name} is not a string")
    return v[:limit]


def _cache(cache: Any) -> dict[str, Any]:
    """A request's ``cache`` object, its fields checked, the ones the schema names only."""
    if type(cache) is not dict:
        raise TypeError("cache is not an object")
    out: dict[str, Any] = {k: opt_count(cache.get(k)) for k in CACHE_COUNTS if k in cache}
    if "enabled" in cache:
        if type(cache["enabled"]) is not bool:
            raise TypeError("cache.enabled is not a bool")
        out["enabled"] = cache["enabled"]
    if "slot_by" in cache:
        out["slot_by"] = _text(cache["slot_by"], "cache.slot_by", CACHE_TEXT_MAX)
    seen = cache.get("seen")
    if seen is not None:
        if type(seen) is not dict:
            raise TypeError("cache.seen is not an object")
        out["seen"] = {"tokens": opt_count(seen.get("tokens"))}
        if "request" in seen:
            out["seen"]["request"] = _text(seen["request"], "cache.seen.request", CACHE_TEXT_MAX)
    div = cache.get("diverged")
    if div is not None:
        if type(div) is not dict:
            raise TypeError("cache.diverged is not an object")
        out["diverged"] = {"at": opt_count(div.get("at"))} | {
            k: _text(div[k], f"cache.diverged.{k}", CACHE_TEXT_MAX)
            for k in ("before", "held", "prompt")
            if k in div
        }
    return out


def _request_spec(spec: Any) -> dict[str, Any]:
    """A request's ``spec`` object, its fields checked, the ones the schema names only."""
    if type(spec) is not dict or type(spec.get("type", "")) is not str:
        raise TypeError("spec is not an object")
    out: dict[str, Any] = {"type": spec.get("type", "")[:CACHE_TEXT_MAX]}
    out |= {k: opt_count(spec.get(k)) for k in REQUEST_SPEC_COUNTS if k in spec}
    for k in ("drafted_by_pos", "accepted_by_pos"):
        v = spec.get(k, [])
        if type(v) is not list or len(v) > MAX_POS:
            raise ValueError(f"spec.{k} is not a list of at most {MAX_POS}")
        for x in v:
            opt_count(x)
        out[k] = v
    return out


# a task entry of a request record (llama-server: its tasks after its first), and how many a
# record keeps at most (the server writes at most 256)
TASK_COUNTS = (
    "index",
    "slot",
    "wait",
    "ttft",
    "model",
    "prompt_tokens",
    "gen_tokens",
    "last_token",
)
TASKS_MAX = 256


def _tasks(tasks: Any) -> list[dict[str, Any]]:
    """A request's ``tasks``, each entry's fields checked, the ones the schema names only."""
    if type(tasks) is not list or len(tasks) > TASKS_MAX:
        raise ValueError(f"tasks is not a list of at most {TASKS_MAX}")
    out = []
    for k in tasks:
        if type(k) is not dict:
            raise TypeError("a task is not an object")
        row: dict[str, Any] = {"id": _text(k.get("id"), "tasks.id", CACHE_TEXT_MAX)}
        if "parent" in k:
            row["parent"] = _text(k["parent"], "tasks.parent", CACHE_TEXT_MAX)
        row |= {f: opt_count(k.get(f)) for f in TASK_COUNTS if f in k}
        if row.get("index") is None:
            raise ValueError("a task has no index")
        out.append(row)
    return out


# a request's body (llama-server at detailed: the JSON the client sent, its media replaced by
# ``instr_media`` markers): kept while its compact re-encoding is at most BODY_MAX bytes
BODY_MAX = 1 << 20
# why a body was not recorded, at most (the server writes "size" or "not_json")
BODY_LEFT_OUT_MAX = 64
# the generated token ids a record keeps, at most (the server writes at most as many)
GEN_IDS_MAX = 16384


def _body(rec: dict[str, Any], out: dict[str, Any]) -> None:
    """A request's ``body`` (an object), kept as its compact JSON text (bytes: a body is held for a
    replay to send, never walked by the reports), with ``body_left_out`` and ``body_bytes``; a body
    over BODY_MAX bytes re-encoded, or one that cannot be, is dropped and said so there."""
    left = rec.get("body_left_out")
    if left is not None:
        left = _text(left, "body_left_out", BODY_LEFT_OUT_MAX)
    body = rec.get("body")
    if body is not None:
        if type(body) is not dict:
            raise TypeError("body is not an object")
        try:
            text = orjson.dumps(body)
        except orjson.JSONEncodeError:  # nested deeper than the encoder goes
            out["body_left_out"] = "not_json"
        else:
            if len(text) <= BODY_MAX:
                out["body"] = text
            else:
                out["body_left_out"], out["body_bytes"] = "size", len(text)
    if left is not None and "body" not in out:
        out.setdefault("body_left_out", left)
    if "body_bytes" in rec:
        out["body_bytes"] = opt_count(rec["body_bytes"])


def _gen_ids(ids: Any) -> array[int]:
    """A request's ``gen_ids``: at most GEN_IDS_MAX token ids, each an integer from 0 to below
    2**62, held as 8 bytes each."""
    if type(ids) is not list or len(ids) > GEN_IDS_MAX:
        raise ValueError(f"gen_ids is not a list of at most {GEN_IDS_MAX}")
    for x in ids:
        if opt_count(x) is None:
            raise ValueError("a generated token id is null")
    return array("q", ids)


def request_record(rec: dict[str, Any]) -> dict[str, Any]:
    """A ``request`` record, checked: its times and counts integers from 0 to below 2**62, its
    texts strings, its ``cache`` and ``spec`` objects and its ``tasks`` of their fields' types (else ValueError or
    TypeError, and the record is skipped). What is kept is the fields the schema names, so that
    a session holds no more per request than they take: its ``body`` as compact JSON bytes (``_body``),
    its ``gen_ids`` as an ``array`` of 64-bit integers."""
    if opt_count(rec["t_arrive"]) is None:
        raise ValueError("t_arrive is null")
    out: dict[str, Any] = {k: rec[k] for k in ("type", "sid", "t_arrive") if k in rec}
    for k in REQUEST_COUNTS:
        if k in rec:
            out[k] = opt_count(rec[k])
    for k in REQUEST_TEXTS:
        v = rec.get(k)
        if v is not None and type(v) is not str:
            raise TypeError(f"{k} is not a string")
        if k in rec:
            out[k] = v
    if "stream" in rec:
        if rec["stream"] is not None and type(rec["stream"]) is not bool:
            raise TypeError("stream is not a bool")
        out["stream"] = rec["stream"]
    if rec.get("cache") is not None:
        out["cache"] = _cache(rec["cache"])
    if rec.get("spec") is not None:
        out["spec"] = _request_spec(rec["spec"])
    if rec.get("tasks") is not None:
        out["tasks"] = _tasks(rec["tasks"])
        out["tasks_left_out"] = opt_count(rec.get("tasks_left_out", 0))
    _body(rec, out)
    if rec.get("gen_ids") is not None:
        out["gen_ids"] = _gen_ids(rec["gen_ids"])
        out["gen_ids_left_out"] = opt_count(rec.get("gen_ids_left_out", 0))
    return out


def part_record(rec: dict[str, Any]) -> dict[str, Any]:
    """A ``part`` record, checked: ``label`` and ``program`` strings (at most PART_TEXT_MAX
    characters kept), ``t_start`` and ``dur`` counts, ``samples_ns`` at most PART_SAMPLES_MAX
    counts (else ValueError or TypeError, and the record is skipped); its schema's fields only."""
    out: dict[str, Any] = {k: rec[k] for k in ("type", "sid", "ts") if k in rec}
    out["label"] = _text(rec["label"], "label", PART_TEXT_MAX)
    if rec.get("program") is not None:
        out["program"] = _text(rec["program"], "program", PART_TEXT_MAX)
    for k in ("t_start", "dur"):
        if opt_count(rec[k]) is None:
            raise ValueError(f"{k} is null")
        out[k] = rec[k]
    samples = rec.get("samples_ns")
    if samples is not None:
        if type(samples) is not list or len(samples) > PART_SAMPLES_MAX:
            raise ValueError(f"samples_ns is not a list of at most {PART_SAMPLES_MAX}")
        for x in samples:
            if opt_count(x) is None:
                raise ValueError("a sample is null")
        out["samples_ns"] = samples
    return out
