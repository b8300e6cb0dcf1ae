"""``instr plan``: the settings of a model that fit the memory given, ranked by predicted speed
(``llamacpp_instr.deciding.plan``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from llamacpp_instr.commands.experts_placement import experts_option, rank_experts
from llamacpp_instr.commands.offload_options import offload_options
from llamacpp_instr.commands.options import (
    ctx_option,
    memory_option,
    quant_option,
    text_json_option,
)

if TYPE_CHECKING:
    from llamacpp_instr.deciding.plan import Candidate
    from llamacpp_instr.running.offload import Offload


@click.command("plan")
@click.argument("model", type=click.Path(path_type=Path, dir_okay=False))
@click.argument("logs", nargs=-1, type=click.Path(path_type=Path))
@memory_option
@ctx_option
@quant_option(
    "Consider the model quantized to TYPE too (repeatable; quantized into the cache, as "
    "instr fit --quant does). Default: the file's own."
)
@click.option(
    "--quality",
    type=click.Path(path_type=Path, dir_okay=False),
    multiple=True,
    metavar="FILE",
    help="A quant-eval report (instr quant-eval --format json) of these quantizations, or of a KV "
    "cache type (quant-eval -ctk/-ctv; repeatable): each setting's mean KL divergence from the "
    "base, for its quantization and KV cache, joins the Pareto front.",
)
@offload_options(layers_default="0, and all too where a GPU option is given: both ranked")
@experts_option
@text_json_option("text: a ranked table; json: one object per setting.")
def command(
    model: Path,
    logs: tuple[Path, ...],
    memory_specs: tuple[str, ...],
    n_ctx: int,
    quants: tuple[str, ...],
    quality: tuple[Path, ...],
    offload: Offload,
    experts: bool,
    fmt: str,
) -> None:
    """Rank the settings of MODEL.gguf that fit the memory, by speed predicted from LOGS.

    Candidates: each --quant, each thread count the LOGS ran, their ubatch and 512, an f16 KV
    cache and a q8_0 one with flash attention, and (with a GPU) no layers or all offloaded. Each is
    checked against the memory at --ctx (the context every setting must hold) with llama.cpp's own projection (as instr fit does), and
    priced from the logs' measured ops (as instr predict does): tokens/s for the first log's
    prompt and generation lengths, with intervals. The Pareto front of memory, generation and
    prompt speed (and, with --quality, the KL divergence from the base of the quantization with
    the setting's KV cache: quant-eval reports of the quants, and of -ctk/-ctv) is marked,
    and each setting comes with the instr run command that runs it. A setting no log covers stays
    in the list, unranked, with what to run.
    """
    from llamacpp_instr.commands.fit import _files
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.deciding import fit, plan
    from llamacpp_instr.deciding.prediction import predict
    from llamacpp_instr.native import bindings, models
    from llamacpp_instr.running import devices
    from llamacpp_instr.running.memory_budget import OutOfMemory

    models.check_gguf(model)
    if not logs:
        raise UserError("give at least one detailed log of a run of this model to rank by speed")
    reports: list[dict[str, object]] = []
    for path in quality:
        try:
            report = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UserError(f"{path}: not a quant-eval JSON report ({exc})") from None
        if not isinstance(report, dict) or "models" not in report:
            raise UserError(f"{path}: not a quant-eval JSON report (no models)")
        reports.append(report)
    from llama_cpp import _logger

    _logger.set_verbose(False)  # llama.cpp's lines per context made
    bindings.load()
    devices.add_rpc_servers(offload.rpc)
    memory = fit.parse_memory(memory_specs)
    limits = {**fit.device_memory(), **memory}
    if experts:
        rank_experts(model, list(logs), limits, n_ctx, offload, fmt)
        return
    sessions = predict.load_logs(list(logs))
    base = predict.default_target(sessions[0], model)
    files = _files(model, quants)
    gpu = bool(offload.gpu_layers) or bool(offload.devices) or bool(offload.rpc)
    cands = plan.candidates(files, sessions, n_ctx, gpu)
    plan.measure_memory(cands, limits, offload)
    plan.price(cands, predict.fit(sessions), sessions, base, [str(p) for p in logs])
    kld: dict[tuple[str, str, str], float] = {}
    for report in reports:
        kld = {**plan.quality(report), **kld}  # the first report given of a setting counts
    for c in cands:
        c.kld = kld.get((c.quant, c.type_k, c.type_v))
    plan.mark_front(cands)
    base_of = reports[0].get("base") if reports else None
    unmeasured = plan.unmeasured_quality(
        cands, str(base_of.get("path")) if isinstance(base_of, dict) else "BASE.gguf"
    )
    ranked = plan.rank(cands)
    spec = _speculation(list(logs), sessions)
    if fmt == "json":
        docs = [c.to_json() for c in ranked]
        for c, d in zip(ranked, docs, strict=True):
            # the speculation the logs measured, on the settings at their thread count
            d["speculation"] = spec if spec and c.threads in spec["threads"] else None
        click.echo(json.dumps(docs, indent=1))
    else:
        click.echo(render(ranked, limits, n_ctx, base))
        if spec:
            click.echo(_spec_lines(spec))
        if unmeasured:
            click.echo("  quality not measured (off the quality front's comparisons):")
            click.echo("\n".join(f"    {line}" for line in unmeasured))
    if not any(c.fits for c in ranked):
        # as instr fit: a setting that does not fit exits 3 (bad input is 2)
        over = sorted({d for c in ranked for d in c.overflow})
        raise OutOfMemory(f"nothing fits: every setting overflows {', '.join(over)}")


def _speculation(logs: list[Path], sessions: list[Any]) -> dict[str, Any] | None:
    """The logs' speculation (llama-server's, with a draft or n-grams): its prediction at every
    draft length (``spec_predict``), or None where no log speculated."""
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.deciding.prediction import spec_predict

    named = [(str(p), f) for p, f in zip(logs, sessions, strict=True) if f.info.verifies]
    if not named:
        return None
    try:
        longest = max(spec_predict.n_max_of(f) for _, f in named)
        return spec_predict.run_sessions(named, longest)
    except UserError:
        return None


def _spec_lines(doc: dict[str, Any]) -> str:
    """The text of the settings' speculation: the fastest draft length at the logs' threads."""
    best = doc["by_n_max"][doc["best_n_max"]]
    plain = doc["by_n_max"][0]["gen_tokens_per_s"]
    threads = ", ".join(map(str, doc["threads"]))
    what = (
        f"--spec-draft-n-max {best['n_max']}: {best['gen_tokens_per_s']:.1f} tokens/s predicted"
        if best["n_max"]
        else "none: the drafts cost more than they save"
    )
    return (
        f"  speculation at {threads} thread(s), drafting with {doc['draft']} "
        f"(from {len(doc['logs'])} llama-server log(s)): the fastest is {what} "
        f"(a plain decode {plain:.1f}; instr predict --spec-draft-n-max N for any other)"
    )


def _rate(v: float | None, c: Candidate, kind: str) -> str:
    p = c.prediction
    iv = (p.gen if kind == "gen" else p.prompt) if p else None
    if v is None or iv is None:
        return "-"
    # the interval at the value's decimals: 3.9 (3.7-4.1), not 3.9 (4-4)
    return f"{v:.1f} ({iv.low:.1f}-{iv.high:.1f})"


def render(ranked: list[Candidate], limits: dict[str, int], n_ctx: int, base: object) -> str:
    from llamacpp_instr.contract.units import fmt_bytes

    fits = [c for c in ranked if c.fits]
    mem = ", ".join(f"{d} {fmt_bytes(n, 'MiB')}" for d, n in limits.items())
    lines = [
        f"settings holding {n_ctx} tokens of context in {mem}: {len(fits)} of {len(ranked)} fit; "
        "speeds are predictions (tokens/s, interval) for the first log's prompt and generation, "
        "* = on the Pareto front of memory, speed and (KLD) quality where measured",
        "",
        f"{'#':>3} {'':1} {'quant':<8} {'thr':>3} {'ubatch':>6} {'kv':<12} {'ngl':>4} "
        f"{'memory':>11} {'gen tok/s':>24} {'prompt tok/s':>24} {'KLD':>7}  command",
    ]
    # logs from a busy machine (predict.Prediction.contended: the same for every setting)
    busy = {x: None for c in ranked if c.prediction for x in c.prediction.contended}
    lines[1:1] = [f"WARNING, a log from a busy machine: {x}" for x in busy]
    rank = 0
    for c in fits:
        kv = c.type_k + (" fa" if c.flash_attn else "")
        # a rank for the covered settings only (plan.rank's first group): "-" for the others
        covered = c.gen is not None
        rank += covered
        num = str(rank) if covered else "-"
        lines.append(
            f"{num:>3} {'*' if c.front else '':1} {c.quant:<8} {c.threads:>3} {c.n_ubatch:>6} "
            f"{kv:<12} {c.n_gpu_layers:>4} {fmt_bytes(c.bytes, 'MiB'):>11} {_rate(c.gen, c, 'gen'):>24} "
            f"{_rate(c.prompt, c, 'prompt'):>24} "
            f"{'-' if c.kld is None else f'{c.kld:.4f}':>7}  {' '.join(c.run_args())}"
        )
    # what no log measured, once each (without the run to make, which names each setting's
    # model: the command above is that run)
    missing = {
        line.split("; ")[0] for c in fits if c.prediction for line in c.prediction.not_covered
    }
    if missing:
        lines.append(
            "  not covered (unranked: run such a setting's command above at --level detailed "
            "and add its log):"
        )
        lines += [f"    {line}" for line in sorted(missing)]
    over = [c for c in ranked if not c.fits]
    if over:
        lines.append(
            f"  {len(over)} setting(s) do not fit (overflowing "
            f"{', '.join(sorted({d for c in over for d in c.overflow}))})"
        )
    return "\n".join(lines)
