"""Which replayed setting would have served the recorded traffic best: the one whose requests most
often met the SLO (goodput), and among equals the one with the lowest p90 end to end. Decided on
the replays' summaries (``converters.session.replay_figures.summary``) alone; the recording is
what they are set against, never a candidate."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llamacpp_instr.converters.session.replay_figures import RECORDED, Slo


@dataclass(frozen=True)
class Verdict:
    """The best setting, its goodput (None without an SLO) and its p90 end to end (ms)."""

    setting: str
    goodput: float | None
    e2e_p90_ms: float | None
    slo: Slo | None

    def line(self) -> str:
        how = f"for the SLO ({self.slo.describe()})" if self.slo is not None else "(no --slo)"
        said = []
        if self.goodput is not None:
            said.append(f"goodput {self.goodput * 100:.1f}%")
        if self.e2e_p90_ms is not None:
            said.append(f"p90 end to end {self.e2e_p90_ms:,.0f} ms")
        return f"best {how}: {self.setting}" + (f" ({', '.join(said)})" if said else "")


def _key(s: dict[str, Any]) -> tuple[float, float]:
    goodput = s.get("goodput")
    p90 = (s.get("e2e_ms") or {}).get("p90")
    return (
        -(goodput if goodput is not None else 0.0),
        p90 if p90 is not None and math.isfinite(p90) else math.inf,
    )


def best_setting(summaries: Sequence[dict[str, Any]], slo: Slo | None) -> Verdict | None:
    """The best of the replayed settings (the most goodput; ties: the lowest p90 end to end; ties
    again: the first given), None when there is none, or when none completed a request."""
    replays = [s for s in summaries if s["setting"] != RECORDED]
    if not replays:
        return None
    best = min(replays, key=_key)  # (min keeps the first of equals)
    if best["requests"] == best["failed"]:
        return None
    return Verdict(best["setting"], best.get("goodput"), best["e2e_ms"].get("p90"), slo)
