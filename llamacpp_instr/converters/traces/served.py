"""Served requests (``instr serve``, llama-server) and labelled parts (llama-bench's tests): slices
on lanes above a session's decode steps, laid out for ``layout.SessionLayout``. A speculating
llama-server's request shows, inside its slice, each draft it made and the verify step that took
it, joined by a flow (``spec`` records)."""

from __future__ import annotations

from collections.abc import Iterator

from ..reading.decode.sessions import SessionInfo
from ..reading.decode.spec import Verify
from ..session.requests import SeqSteps
from .items import Item, Slice, Track, track_uuid


class ServedTracks:
    """One session's request lanes and parts track."""

    def __init__(self, info: SessionInfo, process: Track) -> None:
        self.info = info
        self.process = process
        self.pid = process.pid
        # served requests (instr serve): lanes of non-overlapping requests, each a track
        self.req_lanes: list[tuple[Track, int]] = []  # (track, end of its last request)
        self.req_done = 0
        # llama-server's requests share batches: each one's steps, for its share (requests)
        self.seq_steps = SeqSteps()
        # labelled parts (llama-bench's tests), on one track above the requests
        self.parts_track: Track | None = None
        self.parts_done = 0
        # speculative decoding: the verifies read, by request, until its record comes
        self.spec_done = 0
        self.verifies: dict[str, list[Verify]] = {}

    def pending(self) -> bool:
        """Whether request or part records were read since the last ``items``."""
        return self.req_done < len(self.info.requests) or self.parts_done < len(self.info.parts)

    def items(self) -> Iterator[Item]:
        """Slices for the request records read since the last call. Requests overlap in time
        (they queue for the model), and slices on one track must nest, so each goes on the first
        lane free at its arrival: "requests", "requests (2)", ... above the decode steps. Inside
        each: time to first token, and within it the wait for the model. Then the parts read
        since the last call (``parts``)."""
        reqs = self.info.requests
        verifies = self.info.verifies
        while self.spec_done < len(verifies):
            v = verifies[self.spec_done]
            self.spec_done += 1
            if len(self.verifies) < 65536:  # (a request's record that never comes: bounded)
                self.verifies.setdefault(v.request, []).append(v)
        while self.req_done < len(reqs):
            r = reqs[self.req_done]
            self.req_done += 1
            try:
                t0 = int(r["t_arrive"])
                dur = int(r["dur"] or 0)
            except (KeyError, TypeError, ValueError):
                continue
            lane = next((i for i, (_, end) in enumerate(self.req_lanes) if end <= t0), None)
            if lane is None:
                lane = len(self.req_lanes)
                name = "requests" if lane == 0 else f"requests ({lane + 1})"
                tr = Track(
                    track_uuid(self.info.sid, "requests", lane),
                    name,
                    self.process.uuid,
                    "slices",
                    -100 + lane,  # above the steps tracks (order = context id)
                    self.pid,
                )
                self.req_lanes.append((tr, t0))
                yield tr
            track = self.req_lanes[lane][0]
            self.req_lanes[lane] = (track, t0 + dur)
            args = {
                "id": r.get("id"),
                "endpoint": r.get("endpoint"),
                "status": r.get("status"),
                "stream": bool(r.get("stream")),
                "wait_ms": (r.get("wait") or 0) / 1e6,
                "ttft_ms": (r.get("ttft") or 0) / 1e6 if r.get("ttft") is not None else None,
                "prompt_tokens": r.get("prompt_tokens"),
                "gen_tokens": r.get("gen_tokens"),
            }
            share = self.seq_steps.share(r) if r.get("slot") is not None else None
            if share is not None:  # llama-server: its steps, and its share of shared batches
                args.update(
                    slot=share.slot,
                    steps=share.steps,
                    shared_steps=share.shared_steps,
                    batch_share_ms=share.share_ns / 1e6,
                    steps_ms=share.steps_ns / 1e6,
                )
            name = f"{r.get('method', '')} {r.get('endpoint', '')} {r.get('id', '')}".strip()
            yield Slice(track.uuid, name, t0, dur, 0, "request", args)
            if r.get("ttft") is not None:
                yield Slice(track.uuid, "time to first token", t0, int(r["ttft"]), 1, "request", {})
            if r.get("wait"):
                yield Slice(
                    track.uuid, "waiting for the model", t0, int(r["wait"]), 2, "request", {}
                )
            yield from self.drafts(track, str(r.get("id", "")), t0, t0 + dur)
        yield from self.parts()

    def drafts(self, track: Track, rid: str, t0: int, t1: int) -> Iterator[Item]:
        """A request's drafts and the verify steps that took them, inside its slice (after its
        first token: depth 1), each draft's flow ending at its verify."""
        for k, v in enumerate(self.verifies.pop(rid, ())):
            if not (t0 <= v.t_draft and v.t_verify + v.verify_dur <= t1) or not v.t_draft:
                continue
            flow = track_uuid(self.info.sid, "spec", rid, k)
            steps = f"{v.draft_first}-{v.draft_last}" if v.draft_first >= 0 else "none"
            draft_args = {
                "drafted": v.drafted,
                "draft_steps": steps,
                "catchup_step": v.catchup_step if v.catchup_step >= 0 else None,
                "draft_ms": v.draft_ns / 1e6,
                "type": v.type,
            }
            end = min(v.t_draft + v.draft_dur, v.t_verify)
            yield Slice(
                track.uuid, f"draft {v.drafted}", v.t_draft, end - v.t_draft, 1,
                "speculation", draft_args, (flow,),
            )  # fmt: skip
            verify_args = {
                "step": v.step,
                "accepted": v.accepted,
                "rejected_at": v.rejected_at,
                "verify_ms": v.verify_ns / 1e6,
                "rejected_ms": v.rejected_ns / 1e6,
            }
            yield Slice(
                track.uuid, f"verify: {v.accepted} of {v.drafted} accepted", v.t_verify,
                v.verify_dur, 1, "speculation", verify_args, (), (flow,),
            )  # fmt: skip

    def parts(self) -> Iterator[Item]:
        """A slice per `part` record read since the last call, on the "parts" track."""
        parts = self.info.parts
        while self.parts_done < len(parts):
            p = parts[self.parts_done]
            self.parts_done += 1
            try:
                t0, dur = int(p["t_start"]), int(p["dur"])
            except (KeyError, TypeError, ValueError):
                continue
            if self.parts_track is None:
                self.parts_track = Track(
                    track_uuid(self.info.sid, "parts", 0),
                    "parts",
                    self.process.uuid,
                    "slices",
                    -200,  # above the requests
                    self.pid,
                )
                yield self.parts_track
            samples = [int(x) / 1e6 for x in p.get("samples_ns") or []]
            args = {"label": p.get("label"), "program": p.get("program")}
            if samples:
                args["samples_ms"] = ", ".join(f"{x:.3f}" for x in samples)
            yield Slice(self.parts_track.uuid, str(p.get("label")), t0, dur, 0, "part", args)
