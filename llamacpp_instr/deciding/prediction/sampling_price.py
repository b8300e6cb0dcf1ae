"""Sampling priced as the logs measured it (their ``host`` records): what a generated token's
sampling costs at another vocabulary and number of slots, and when backend sampling (``-bs``) or
fewer samplers would pay.

The price is the logs' own: each sampler's time per token sampled, as measured. Two rules carry it
to another setting, both from how the pin samples:

* the vocabulary: every pass of the chain runs over the candidates array common's sampler builds
  from the whole vocabulary's logits (the candidates themselves, penalties, DRY, the grammar's full
  pass, the final pick's softmax), so a token's sampling is priced in proportion to ``n_vocab``;
* the slots: llama-server samples each slot's output one after the other on its one thread, after
  the step's decode, so a generation step of N slots adds N tokens' sampling to its time, each at
  the price measured for steps of N slots, where a log has them. A token's sampling costs more per
  token with more slots (each slot's candidates array, 12 bytes a vocabulary entry, and its
  penalties' history leave the caches to the next slot's: `bench/sampling_price_check.py` measures
  it), so a slot count no log ran is priced at the nearest count measured below it, and the answer
  says so.

What backend sampling would save is not measured unless a ``-bs`` log is given: the advice says
how much of a token's time the chain took (the most ``-bs`` can move off the host), and which
sampler took most of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llamacpp_instr.converters.reading.decode.host import sampler_type

if TYPE_CHECKING:
    from llamacpp_instr.converters.analysis.frames import SessionFrames

SLOTS = (1, 4, 8)  # the slots a prediction prices sampling at
WORTH = 0.10  # a share of a token's time from which a change of the sampling is worth a run


@dataclass
class SamplingPrice:
    """A generated token's sampling, measured and carried to a setting."""

    n_vocab: int  # the measured logs' vocabulary ...
    tokens: int  # ... and the generated tokens they sampled
    sample_ns: float  # per token sampled, as measured
    chain_ns: float  # of which in the sampler chains
    decode_ns: float  # per generation step, as measured (the logs' slots')
    samplers: dict[str, float] = field(default_factory=dict)  # per token, by sampler type
    backend: bool = False  # whether some sampling ran on the backend (-bs) in the logs
    # per token sampled, by the slots a generation step sampled (its sequences' tokens)
    by_slots: dict[int, float] = field(default_factory=dict)

    def measured_at(self, slots: int) -> int:
        """The slot count whose measured price prices ``slots``: itself, or the nearest below it
        (else the fewest measured)."""
        below = [k for k in self.by_slots if k <= slots]
        return max(below) if below else min(self.by_slots, default=slots)

    def at(self, n_vocab: int | None = None, slots: int = 1) -> dict[str, Any]:
        """The price at ``n_vocab`` (None: the logs') and ``slots``: per token and per step,
        each sampler's, and the advice."""
        scale = (n_vocab or self.n_vocab) / self.n_vocab
        k = self.measured_at(slots)
        at_k = self.by_slots.get(k, self.sample_ns) / self.sample_ns if self.sample_ns else 1.0
        per_token = self.sample_ns * scale * at_k
        scale *= at_k  # each sampler in the same proportion
        step = self.decode_ns + slots * per_token
        share = slots * per_token / step if step else 0.0
        samplers = {k: v * scale for k, v in sorted(self.samplers.items(), key=lambda x: -x[1])}
        return {
            "n_vocab": n_vocab or self.n_vocab,
            "slots": slots,
            "sampling_ms_per_token": per_token / 1e6,
            "chain_ms_per_token": self.chain_ns * scale / 1e6,
            "sampling_ms_per_step": slots * per_token / 1e6,
            "sampling_share_of_step": share,
            "samplers_ms_per_token": {k: v / 1e6 for k, v in samplers.items()},
            "advice": self.advice(share, samplers, per_token)
            + (
                [
                    f"sampling at {slots} slots is priced from steps of {k}: a token's sampling "
                    "costs more with more slots; add a log of a run at that many"
                ]
                if k != slots
                else []
            ),
            "measured": {"n_vocab": self.n_vocab, "tokens": self.tokens, "slots": k},
        }

    def advice(self, share: float, samplers: dict[str, float], per_token: float) -> list[str]:
        out = []
        if share >= WORTH and not self.backend:
            out.append(
                f"sampling takes {share * 100:.0f} % of a generation step: backend sampling "
                f"(-bs) moves the chain's {self.chain_ns / max(self.sample_ns, 1) * 100:.0f} % "
                "of it into the graph; measure a -bs run and add its log"
            )
        if samplers and per_token:
            name, ns = next(iter(samplers.items()))
            if ns / per_token >= 0.5 and share >= WORTH:
                out.append(
                    f"{name} takes {ns / per_token * 100:.0f} % of each token's sampling "
                    f"({ns / 1e6:.3f} ms): fewer or cheaper samplers would pay"
                )
        return out


def measure(sessions: list[SessionFrames]) -> SamplingPrice | None:
    """The logs' sampling per generated token (None: no log recorded it)."""
    tokens = sample = chain = decode = steps = 0
    by_type: dict[str, float] = {}
    n_vocab = 0
    backend = False
    at: dict[int, list[int]] = {}  # slots -> [tokens, ns]
    for f in sessions:
        if f.host.empty or f.steps.empty:
            continue
        # generation: the steps each of whose tokens was sampled after it (one slot's single
        # token, or a server's batch of several slots' tokens), whatever their kind
        st = f.steps[["ctx", "step", "dur_ns", "n_tokens"]].rename(columns={"dur_ns": "step_ns"})
        h = f.host.merge(st, on=["ctx", "step"])
        h = h[(h["sampled"] > 0) & (h["sampled"] == h["n_tokens"])]
        if h.empty:
            continue
        gen = h[["ctx", "step"]]
        n_vocab = n_vocab or int(f.info.model.get("n_vocab") or 0)
        tokens += int(h["sampled"].sum())
        sample += int(h["sample_ns"].sum())
        chain += int(h["chain_ns"].sum())
        decode += int(h["step_ns"].sum())
        steps += len(h)
        for n, ns in h.groupby("sampled")["sample_ns"].sum().items():
            t_ns = at.setdefault(int(n), [0, 0])
            t_ns[0] += int(n) * int((h["sampled"] == n).sum())
            t_ns[1] += int(ns)
        p = f.samplers
        if not p.empty:
            p = p.merge(gen[["ctx", "step"]], on=["ctx", "step"], how="inner")
            backend = backend or bool((p["kind"].astype(str) == "backend").any())
            for kind, name, ns in p[["kind", "sampler", "ns"]].itertuples(False):
                label = sampler_type(str(kind), str(name))
                if label is not None:
                    by_type[label] = by_type.get(label, 0.0) + int(ns)
    if not tokens or not n_vocab:
        return None
    return SamplingPrice(
        n_vocab=n_vocab,
        tokens=tokens,
        sample_ns=sample / tokens,
        chain_ns=chain / tokens,
        decode_ns=decode / max(steps, 1),
        samplers={k: v / tokens for k, v in by_type.items()},
        backend=backend,
        by_slots={n: ns / t for n, (t, ns) in at.items() if t},
    )
