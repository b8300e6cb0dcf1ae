"""``instr predict`` as a library call: the setting asked (``PredictRequest``: the first log's,
with what is given changed) priced by ``predict`` for each quantization, or speculative decoding
at another draft length by ``spec_predict``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.deciding.measures import Machine
from llamacpp_instr.running.offload import Offload

from . import net_costs, predict, sampling_price, spec_predict


@dataclass(frozen=True)
class PredictRequest:
    """Prompt and generation tokens/s for a setting not run, from ``logs`` (detailed logs of runs
    on this machine): the first log's setting with each field given here changed (None: the
    log's). ``quants``: one prediction per quantization of the model; ``offload``: the layers'
    placement (None: the log's); ``rpc_rate``/``rpc_rtt``: the RPC network, as --rpc-rate and
    --rpc-rtt take them (100M, 2ms); ``spec_n_max``: speculative decoding at that draft length
    instead, from llama-server logs; ``probe``: attention at a depth beyond the logs' measured
    on this machine by the probe (``kv_probe``), else priced by its line per KV cell."""

    logs: tuple[Path, ...]
    threads: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    n_prompt: int | None = None
    n_predict: int | None = None
    depth: int | None = None
    model: Path | None = None
    quants: tuple[str, ...] = ()
    offload: Offload | None = None
    rpc_rate: str | None = None
    rpc_rtt: str | None = None
    spec_n_max: int | None = None
    probe: bool = True  # attention beyond the logs' KV cells measured here (kv_probe)


@dataclass
class PredictResult:
    """One prediction per quantization asked, or the speculation's (``spec_predict.run``)."""

    predictions: list[predict.Prediction] = field(default_factory=list)
    speculation: dict[str, Any] | None = None
    # a generated token's sampling as the logs measured it (None: no log recorded it)
    sampling: sampling_price.SamplingPrice | None = None

    def sampling_at(self) -> list[dict[str, Any]]:
        """The sampling's price at the logs' vocabulary for 1, 4 and 8 slots."""
        s = self.sampling
        return [s.at(slots=n) for n in sampling_price.SLOTS] if s is not None else []

    def to_json(self) -> Any:
        if self.speculation is not None:
            return self.speculation
        sampling = {"sampling": self.sampling_at()} if self.sampling is not None else {}
        docs = [p.to_json() | sampling for p in self.predictions]
        # one object for one setting; a list, one per --quant, for several
        return docs[0] if len(docs) == 1 else docs

    def failure(self) -> UserError | None:
        """What no log measured: its speed is not given, exit status 2."""
        n_missing = sum(len(p.not_covered) for p in self.predictions)
        if n_missing:
            return UserError(f"not covered: {n_missing} thing(s) no log measured (listed above)")
        return None


def predict_setting(
    request: PredictRequest, machine: Machine, say: Callable[[str], None] = lambda _: None
) -> PredictResult:
    """``instr predict``: the request's setting priced from its logs' measured ops (``predict``)
    on ``machine``, one prediction per quantization; ``say`` hears the quantizer's progress."""
    from llamacpp_instr.native import models

    if request.spec_n_max is not None:  # speculative decoding: from the logs' verifies alone
        doc = spec_predict.run(list(request.logs), request.spec_n_max, request.n_predict)
        return PredictResult(speculation=doc)
    rate_bits = rtt_ns = None
    try:
        rate_bits = net_costs.parse_rate(request.rpc_rate) if request.rpc_rate is not None else None
    except ValueError:
        raise UserError(
            "--rpc-rate takes a rate in bits/s above 0 (100M, 1G, 2.5Gbit), not "
            f"{request.rpc_rate!r}"
        ) from None
    try:
        rtt = request.rpc_rtt
        rtt_ns = net_costs.parse_duration_ns(rtt) if rtt is not None else None
    except ValueError:
        raise UserError(
            f"--rpc-rtt takes a time of at least 0 with its unit (2ms, 500us), not {rtt!r}"
        ) from None
    if request.model is not None:
        models.check_gguf(request.model)
    sessions = predict.load_logs(list(request.logs))
    base = predict.default_target(sessions[0], request.model)
    changes: dict[str, Any] = {
        "threads": request.threads,
        "n_ubatch": request.n_ubatch,
        "n_batch": request.n_batch,
        "n_prompt": request.n_prompt,
        "n_gen": request.n_predict,
        "depth": request.depth,
        "rpc_rate": rate_bits,
        "rpc_rtt_ns": rtt_ns,
        "offload": request.offload,  # the log's placement, unless one is given
    }
    base = replace(base, **{k: v for k, v in changes.items() if v is not None})
    if (rate_bits is not None or rtt_ns is not None) and not (base.rpc_servers or base.offload.rpc):
        raise UserError(
            "--rpc-rate and --rpc-rtt price RPC servers' network: the log ran on none, and "
            "--rpc names none"
        )
    files = (
        machine.quantized(base.model, request.quants, say) if request.quants else [("", base.model)]
    )
    cost_model = predict.fit(sessions, machine=machine if request.probe else None)
    names = [str(p) for p in request.logs]
    return PredictResult(
        [
            predict.price(
                replace(base, model=f), cost_model, sessions, names, machine, probe=request.probe
            )
            for _q, f in files
        ],
        sampling=sampling_price.measure(sessions),
    )
