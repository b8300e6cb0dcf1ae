"""Images and sounds in a trace: each medium's load and preprocessing as slices on "media"
lanes (media overlap in time: llama-server's requests load theirs at once), an encoder's encodes
on its context's track (``layout.SessionLayout.encode``: named and described here), and a flow
from each encode to the decode steps that carry its embeddings (``media_flow``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..reading.decode.media import Encode, Medium
from ..reading.decode.sessions import SessionInfo
from ..reading.decode.steps import Step
from .items import Item, Slice, Track, track_uuid

ORDER = -150  # above the steps tracks (order = context id), below the requests (-100 + lane)
MAX_LANES = 64  # lanes at most: media overlapping more than this share the last


def media_flow(sid: str, media: int, slice_: int) -> int:
    """The flow from the encode of a medium's slice through the decode steps of its embeddings
    (Perfetto chains the events that carry one flow id, in time order)."""
    return track_uuid(sid, "media", media, slice_)


def step_flows(sid: str, step: Step | Encode) -> tuple[int, ...]:
    """The media flows an encode starts, or a decode step carries (medium 0: one tokenized
    outside the session, which no flow names)."""
    return tuple(media_flow(sid, m, k) for m, k in step.media if m > 0)


def noun(kind: str) -> str:
    """A medium's kind in words: image, sound."""
    return "sound" if kind == "audio" else kind


def modality(info: SessionInfo, ctx: int) -> str:
    """An encoder context's modality in words (image, sound), as its context record says."""
    return noun(str(info.contexts.get(ctx, {}).get("encoder", {}).get("modality", "")))


def encoder_track_name(info: SessionInfo, ctx: int) -> str:
    """An encoder context's steps track: "image encoder gemma3 (ctx 3)"."""
    model = info.contexts.get(ctx, {}).get("model", {})
    what = " ".join(x for x in (modality(info, ctx), "encoder") if x)
    return f"{what} {model.get('architecture', '')} (ctx {ctx})".replace("  ", " ")


def medium_name(m: Medium) -> str:
    size = f"{m.nx:,} samples" if m.kind == "audio" else f"{m.nx}x{m.ny}"
    return f"{noun(m.kind)} {m.id} ({size}, {m.tokens} tokens)"


def encode_name(step: Encode, kind: str) -> str:
    """An encode's slice name, as a decode step's is (its kind, then its step): "encode", the
    step, then its media ("image 2", "image 2:1" for a slice after a medium's first, "+3" for
    more slices)."""
    shown = [f"{m}" if k == 0 else f"{m}:{k}" for m, k in step.media[:4]]
    more = len(step.media) - len(shown) + step.more
    what = " ".join(shown) + (f" +{more}" if more else "")
    return f"encode #{step.index} {kind} {what}".rstrip()


# an encode's medium slices its args name at most (the rest counted: "+N")
ARGS_SLICES = 16


def encode_args(step: Encode) -> dict[str, Any]:
    more = len(step.media) - ARGS_SLICES + step.more
    args: dict[str, Any] = {
        "step": step.index,
        "kind": "encode",
        "embeddings": step.n_tokens,
        "media": " ".join(f"{m}:{k}" for m, k in step.media[:ARGS_SLICES])
        + (f" +{more}" if more > 0 else ""),
        "first": step.first,
        "status": step.status if step.status is not None else "not ended",
        "ended": step.ended,
        "op_time_ns": step.op_time,
    }
    if step.target is not None:
        args["target"] = f"ctx {step.target[0]} seq {step.target[1]}"
    if step.request is not None:
        args["request"] = step.request
    return args


class MediaTracks:
    """One session's media lanes, fed the media records read since the last call."""

    def __init__(self, info: SessionInfo, process: Track) -> None:
        self.info = info
        self.process = process
        self.done = 0
        self.lanes: list[tuple[Track, int]] = []  # (track, end of its last medium)

    def pending(self) -> bool:
        return self.done < len(self.info.media)

    def items(self) -> Iterator[Item]:
        """Each medium read since the last call: a slice from its load's start to its
        preprocessing's end, holding a slice for each."""
        media = self.info.media
        while self.done < len(media):
            m = media[self.done]
            self.done += 1
            parts = [
                (name, t, d)
                for name, t, d in (
                    ("load", m.t_load, m.load_ns),
                    ("preprocess", m.t_preprocess, m.preprocess_ns),
                )
                if t >= 0
            ]
            if not parts:
                continue
            t0 = min(t for _, t, _ in parts)
            t1 = max(t + d for _, t, d in parts)
            parts.sort(key=lambda p: p[1])
            if len(parts) == 2 and parts[1][1] < parts[0][1] + parts[0][2]:
                parts = []  # (overlapping, which slices on a track cannot: the medium's alone)
            lane = next((i for i, (_, end) in enumerate(self.lanes) if end <= t0), None)
            if lane is None and len(self.lanes) < MAX_LANES:
                lane = len(self.lanes)
                name = "media" if lane == 0 else f"media ({lane + 1})"
                tr = Track(
                    track_uuid(self.info.sid, "media", "lane", lane),
                    name,
                    self.process.uuid,
                    "slices",
                    ORDER + lane,
                    self.process.pid,
                )
                self.lanes.append((tr, t0))
                yield tr
            elif lane is None:
                continue  # (more media at once than lanes: a damaged log's)
            track = self.lanes[lane][0]
            self.lanes[lane] = (track, t1)
            args = {
                "media": m.id,
                "kind": m.kind,
                "nx": m.nx,
                "ny": m.ny,
                "bytes": m.bytes,
                "hash": m.hash_text,
                "slices": m.slices,
                "tokens": m.tokens,
                "n_pos": m.n_pos,
            }
            yield Slice(track.uuid, medium_name(m), t0, t1 - t0, 0, "media", args)
            for name, t, d in parts:
                yield Slice(track.uuid, name, t, d, 1, "media", {"ms": d / 1e6})
