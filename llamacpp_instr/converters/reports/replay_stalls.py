"""A replay's stalls: in each run's own log (the recording's, each setting's), the late tokens of
the replayed requests, with their causes as ``instr requests`` names them (``requests_report``'s
stories: "token 17 of task-0 came 3,448 ms late: slot 0 was prefilling 576 tokens of task-18 in
the same batch"), each request also by its recorded id, so that one request's stall reads the same
under every setting."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError

from .report import Column, Fact, Section, Table

COLUMNS = [
    Column("setting", "setting"),
    Column("recorded_id", "recorded id"),
    Column("request", "request"),
    Column("token", "token", "int"),
    Column("gap_ms", "gap (ms)", "f1"),
    Column("late_ms", "late (ms)", "f1"),
    Column("prefill_recorded_id", "behind the prefill of (recorded id)"),
    Column("cause", "cause"),
]


def stalls(
    setting: str,
    log: Path,
    sid: str | None,
    recorded_ids: Mapping[str, str] | None = None,
    replayed: Collection[str] | None = None,
) -> list[dict[str, Any]]:
    """The late tokens of ``log``'s session ``sid`` (default: its latest), worst first, of the
    requests a replay sent: ``recorded_ids`` maps a replay's request ids to their recorded ids
    (only those are kept); without it (the recording), the ids are the recorded ones, and
    ``replayed`` keeps those the replay sent."""
    from ..analysis.frames import load_session  # (pandas: loaded here, not with the report)
    from .requests_report import request_stories

    try:
        frames = load_session(log, sid)
    except (UserError, OSError):
        return []  # (a log that does not read has no stalls to name; its figures say the rest)

    def recorded(rid: str | None) -> str | None:
        if rid is None:
            return None
        return rid if recorded_ids is None else recorded_ids.get(rid)

    rows: list[dict[str, Any]] = []
    for story in request_stories(frames):
        rid = recorded(story.id)
        if rid is None or (replayed is not None and rid not in replayed):
            continue
        for t in story.late_tokens:
            prefill = next((s for s in t.shared if s["prefill"]), None)
            by = prefill["request"] if prefill is not None else None
            rows.append(
                {
                    "setting": setting,
                    "request": story.id,
                    "recorded_id": rid,
                    "token": t.token,
                    "gap_ms": t.gap_ns / 1e6,
                    "late_ms": t.late_ns / 1e6,
                    "cause": t.cause,
                    "prefill_request": by,
                    "prefill_recorded_id": recorded(by),
                    "prefill_slot": prefill["slot"] if prefill is not None else None,
                    "prefill_tokens": prefill["tokens"] if prefill is not None else None,
                }
            )
    rows.sort(key=lambda r: -r["gap_ms"])
    return rows


def _fact(setting: str, rows: list[dict[str, Any]]) -> Fact:
    if not rows:
        return Fact(f"late tokens, {setting}", "none")
    worst = rows[0]
    behind = sum(1 for r in rows if r["prefill_request"] is not None)
    by = (
        f", behind {worst['prefill_recorded_id'] or worst['prefill_request']}'s prefill"
        if worst["prefill_request"] is not None
        else ""
    )
    return Fact(
        f"late tokens, {setting}",
        f"{len(rows):,} ({behind:,} behind another request's prefill); the worst "
        f"{worst['gap_ms']:,.0f} ms, token {worst['token']} of {worst['recorded_id']}{by}",
    )


def section(by_setting: Mapping[str, list[dict[str, Any]]]) -> Section:
    """The stalls of each run (the recording first), worst first in each."""
    rows = [r for setting_rows in by_setting.values() for r in setting_rows]
    return Section(
        "Stalls",
        facts=[_fact(name, r) for name, r in by_setting.items()],
        text="The replayed requests' late tokens in each run's own log, as `instr requests` names "
        "their causes (a gap longer than the request's median by half of it, and by 1 ms at "
        "least; the three worst of a request); ids are each log's own, and the recorded id the "
        "recording's, in every run.",
        tables=[Table("stalls", "Late tokens and their causes", COLUMNS, rows, top=20)],
    )
