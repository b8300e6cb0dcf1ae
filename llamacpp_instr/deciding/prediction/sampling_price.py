"""Sampling priced as the logs measured it (their ``host`` records): what a generated token's
sampling costs at another vocabulary and number of slots, and when backend sampling (``-bs``) or
fewer samplers would pay.

The price is the logs' own: each sampler's time per token sampled, as measured. Two rules carry it
to another setting, both from how the pin samples:

* the vocabulary: every pass of the chain runs over the candidates array common's sampler builds
  from the whole vocabulary's logits (the candidates themselves, penalties, DRY, the grammar's full
  pass, the final pick's softmax), so a token's sampling is priced in proportion to ``n_vocab``;
* the slots: llama-server samples each slot's output one after the other on its one thread, after
  the step's decode, so a generation step of N slots adds N tokens' sampling to its time.

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
    decode_ns: float  # per generation step, as measured (one slot's)
    samplers: dict[str, float] = field(default_factory=dict)  # per token, by sampler type
    backend: bool = False  # whether some sampling ran on the backend (-bs) in the logs

    def at(self, n_vocab: int | None = None, slots: int = 1) -> dict[str, Any]:
        """The price at ``n_vocab`` (None: the logs') and ``slots``: per token and per step,
        each sampler's, and the advice."""
        scale = (n_vocab or self.n_vocab) / self.n_vocab
        per_token = self.sample_ns * scale
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
            "advice": self.advice(share, samplers, per_token),
            "measured": {"n_vocab": self.n_vocab, "tokens": self.tokens},
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
    for f in sessions:
        if f.host.empty or f.steps.empty:
            continue
        gen = f.steps[f.steps["kind"] == "gen"][["ctx", "step", "dur_ns"]]
        h = f.host.merge(gen, on=["ctx", "step"], how="inner")
        if h.empty or not int(h["sampled"].sum()):
            continue
        n_vocab = n_vocab or int(f.info.model.get("n_vocab") or 0)
        tokens += int(h["sampled"].sum())
        sample += int(h["sample_ns"].sum())
        chain += int(h["chain_ns"].sum())
        decode += int(gen["dur_ns"].sum())
        steps += len(gen)
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
    )
