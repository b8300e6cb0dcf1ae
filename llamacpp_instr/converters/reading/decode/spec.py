"""llama-server's speculative decoding records: ``context`` (a context's model and role: a target,
its draft, or mtmd's encoder of images or sounds) and ``spec``
(one verify step of a slot: what it drafted, what the target accepted, the steps and times of
both). Each is checked here once; a record without the schema's shape raises one of
``fields.MALFORMED`` and is skipped as every damaged record is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fields import as_dict, opt_count, uint

ROLES = ("target", "draft", "encoder")
MODALITIES = ("image", "audio")  # an encoder's (another is kept as "other")
MAX_POS = 256  # draft positions a record may speak of (the server keeps as many)
TEXT_MAX = 256  # a name or type read from a record, at most
MAX_CONTEXTS = 1024  # contexts a session's records may describe (the later ones are left out)


def _text(v: Any, name: str) -> str:
    if type(v) is not str:
        raise TypeError(f"{name} is not a string")
    return v[:TEXT_MAX]


def context_record(rec: dict[str, Any]) -> dict[str, Any]:
    """A ``context`` record, checked: ``{"ctx", "role", "model": {...}, "n_ctx", "n_seq_max",
    "spec": {...} or {}, "encoder": {...} or {}}`` (an encoder's: mtmd's, ``_encoder``)."""
    ctx = uint(rec["ctx"], 1)
    role = rec["role"]
    if role not in ROLES:
        raise ValueError(f"role {role!r}")
    model = {
        k: (_text(v, k) if k in ("name", "architecture", "desc", "path") else opt_count(v))
        for k, v in as_dict(rec.get("model")).items()
        if k in ("name", "architecture", "desc", "path", "n_layer", "n_params", "size_bytes")
    }
    spec = as_dict(rec.get("spec"))
    if spec:
        spec = {
            "type": _text(spec.get("type", ""), "spec.type"),
            "n_max": opt_count(spec.get("n_max")) or 0,
            "n_min": opt_count(spec.get("n_min")) or 0,
            "p_min": float(spec.get("p_min") or 0.0),
        }
    return {
        "ctx": ctx,
        "role": role,
        "model": model,
        "n_ctx": opt_count(rec.get("n_ctx")),
        "n_seq_max": opt_count(rec.get("n_seq_max")),
        "spec": spec,
        "encoder": _encoder(rec.get("encoder")) if role == "encoder" else {},
    }


def _encoder(raw: Any) -> dict[str, Any]:
    """An encoder's ``encoder`` object: its modality and widths, the image and patch sizes."""
    enc = as_dict(raw)
    modality = _text(enc.get("modality", ""), "encoder.modality")
    out: dict[str, Any] = {"modality": modality if modality in MODALITIES else "other"}
    for k in ("n_embd", "n_embd_out", "image_size", "patch_size"):
        out[k] = opt_count(enc.get(k))
    return out


@dataclass(frozen=True)
class Verify:
    """One ``spec`` record: a slot's draft, verified by one step of the target."""

    request: str
    slot: int
    type: str
    ctx: int  # the target's context
    step: int  # the target's step that verified it (-1: unknown)
    draft_ctx: int | None  # the draft's context (None: an n-gram draft, made without a model)
    draft_first: int  # the draft's steps that made it, first and last (-1: none)
    draft_last: int
    catchup_step: int  # the draft's step that took the verified batch in (-1: none)
    drafted: int
    accepted: int
    t_draft: int  # when drafting began (ns, the log's clock; 0: reused an earlier draft)
    draft_dur: int  # how long the drafting round took (all the slots it drafted for)
    draft_ns: int  # its share of the drafting and of the draft's catch-up
    t_verify: int  # when the target's verify step began
    verify_dur: int  # how long it took (all the slots it verified for)
    verify_ns: int  # its share of the verify step
    rejected_ns: int  # of both, the share of its rejected tokens

    @property
    def rejected_at(self) -> int | None:
        """The draft position of the first rejected token (None: all accepted)."""
        return self.accepted if self.accepted < self.drafted else None

    @property
    def produced(self) -> int:
        """Tokens this verify gave the request: the accepted ones and the target's own next one."""
        return self.accepted + 1


def spec_record(rec: dict[str, Any]) -> Verify:
    """A ``spec`` record, checked (its counts and times integers from 0 to below 2**62, accepted
    at most drafted, at most ``MAX_POS`` drafted)."""
    drafted = uint(rec["drafted"], 1)
    accepted = uint(rec["accepted"])
    if accepted > drafted or drafted > MAX_POS:
        raise ValueError(f"accepted {accepted} of {drafted} drafted")
    steps = rec.get("draft_steps")
    first = last = -1
    if steps is not None:
        if type(steps) is not list or len(steps) != 2:
            raise ValueError("draft_steps is not [first, last]")
        first, last = uint(steps[0]), uint(steps[1])
        if last < first:
            raise ValueError("draft_steps ends before it begins")
    step = rec["step"]
    if type(step) is not int or step < -1:
        raise ValueError(f"step {step!r}")
    draft_ctx = rec.get("draft_ctx")
    catchup = rec.get("catchup_step")
    return Verify(
        request=_text(rec["request"], "request"),
        slot=uint(rec["slot"]),
        type=_text(rec.get("spec_type", ""), "spec_type"),
        ctx=uint(rec["ctx"]),
        step=step,
        draft_ctx=None if draft_ctx is None else uint(draft_ctx, 1),
        draft_first=first,
        draft_last=last,
        catchup_step=-1 if catchup is None else uint(catchup),
        drafted=drafted,
        accepted=accepted,
        t_draft=uint(rec["t_draft"]),
        draft_dur=uint(rec["draft_dur"]),
        draft_ns=uint(rec["draft_ns"]),
        t_verify=uint(rec["t_verify"]),
        verify_dur=uint(rec["verify_dur"]),
        verify_ns=uint(rec["verify_ns"]),
        rejected_ns=uint(rec["rejected_ns"]),
    )
