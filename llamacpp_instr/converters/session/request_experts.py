"""Which experts a server's request routed to: per layer, the tokens its steps sent
to each expert, from the ``experts`` records of the steps that were its own.

A request's steps are those of its slot while it held the slot (``request_causes``' own steps:
each step given to the one request that held the slot then). Where a step's batch carried its
tokens alone, the step's routing is all the request's. Where the batch also carried other
sequences' tokens, the log's routing is the batch's, not split by sequence: such a step is
counted (``shared_steps``) and its routing left out, not guessed."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .request_causes import StepRow, _own_steps

# (layer, expert, tokens) rows of one step's routing (all its computes)
StepRouting = list[tuple[int, int, int]]

HOTTEST = 3


@dataclass
class RequestExperts:
    id: str
    steps: int  # its steps whose routing is its own (their batch carried its tokens alone)
    shared_steps: int  # steps with routing that it shared with other sequences: not split
    n_expert: int
    load: dict[int, list[int]] = field(default_factory=dict)  # layer -> tokens per expert

    def hottest(self) -> list[tuple[int, int, float]]:
        """The busiest (layer, expert) pairs and their share of the layer's tokens."""
        cells = [
            (t, layer, e, t / (sum(row) or 1))
            for layer, row in self.load.items()
            for e, t in enumerate(row)
            if t
        ]
        cells.sort(key=lambda c: (-c[0], c[1], c[2]))
        return [(layer, e, share) for _, layer, e, share in cells[:HOTTEST]]

    def used(self) -> float | None:
        """The mean number of experts each layer routed its tokens to (None: no routing)."""
        if not self.load:
            return None
        return sum(sum(1 for t in row if t) for row in self.load.values()) / len(self.load)

    def row(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "shared_steps_not_split": self.shared_steps,
            "n_expert": self.n_expert,
            "experts_used_per_layer": self.used(),
            "hottest": [[layer, e, s] for layer, e, s in self.hottest()],
            "layers": [
                {"layer": layer, "load": row, "experts_used": sum(1 for t in row if t)}
                for layer, row in sorted(self.load.items())
            ],
        }


def request_experts(
    requests: Iterable[dict[str, Any]],
    rows: Sequence[tuple[StepRow, int]],
    routed: dict[int, StepRouting],
    n_expert: int,
) -> dict[str, RequestExperts]:
    """Each request's experts by its id. ``rows``: the session's steps in time order, each with
    its step index; ``routed``: each step's routing (steps without routing absent)."""
    reqs = [r for r in requests if isinstance(r, dict)]
    step_of = {id(row): step for row, step in rows}
    mine, _ = _own_steps(reqs, [row for row, _ in rows])
    out: dict[str, RequestExperts] = {}
    for k, r in enumerate(reqs):
        rid = str(r.get("id", ""))
        got = out.setdefault(rid, RequestExperts(rid, 0, 0, n_expert))
        for row in mine.get(k, []):
            routing = routed.get(step_of[id(row)])
            if routing is None:
                continue
            if len({q for q, n in row[3] if n}) > 1:
                got.shared_steps += 1
                continue
            got.steps += 1
            for layer, e, tokens in routing:
                got.load.setdefault(layer, [0] * n_expert)[e] += tokens
    return out
