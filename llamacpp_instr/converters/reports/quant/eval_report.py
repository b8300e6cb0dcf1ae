"""The report of ``instr quant-eval`` as a ``Report``: perplexity and KL divergence of each quant
against the base, as llama-perplexity ``--kl-divergence`` prints them (the formulas are in
``llamacpp_instr.running.quant.evaluate``). Pure Python: it renders the data dict ``quant_eval.evaluate``
returns, which is also the JSON output, so it works without llama_cpp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..report import Chart, Column, Fact, Report, Section, Series, Table

# (data key, label) of the KLD percentiles in the table and the chart
KLD_PERCENTILES = (
    ("median", "median"),
    ("p90", "90%"),
    ("p95", "95%"),
    ("p99", "99%"),
    ("p99_9", "99.9%"),
)


@dataclass
class SigColumn(Column):
    """A numeric column shown with a fixed number of decimals (KL divergences of a good quant are
    around 1e-3 nats: llama-perplexity prints them with 6)."""

    decimals: int = 6

    def show(self, v: Any) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "–"
        return f"{v:.{self.decimals}f}"


def _name(path: str) -> str:
    return Path(path).name


def _model_name(m: dict[str, Any]) -> str:
    """A compared model's name, with its KV cache where not f16 (the base's)."""
    kv = (m.get("type_k", "f16"), m.get("type_v", "f16"))
    cache = "" if kv == ("f16", "f16") else f" (KV {kv[0]}/{kv[1]})"
    return _name(m["path"]) + cache


def _rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    base = data["base"]
    rows: list[dict[str, Any]] = [
        {"model": _name(base["path"]) + " (base)", "ppl": base["ppl"], "ppl_err": base["ppl_err"]}
    ]
    for m in data["models"]:
        k = m["kld"]
        row: dict[str, Any] = {
            "model": _model_name(m),
            "ppl": m["ppl"],
            "ppl_err": m["ppl_err"],
            "ln_ppl_ratio": m["ln_ppl_ratio"],
            "ln_ppl_ratio_err": m["ln_ppl_ratio_err"],
            "kld_mean": k["mean"],
            "kld_mean_err": k["mean_err"],
        }
        for key, _ in KLD_PERCENTILES:
            row[f"kld_{key}"] = k[key]
        row["kld_max"] = k["max"]
        # Δp in percentage points, as llama-perplexity prints it
        row["delta_p_mean"] = 100.0 * m["delta_p"]["mean"]
        row["delta_p_rms"] = 100.0 * m["delta_p"]["rms"]
        row["same_top_p"] = m["same_top_p"]
        rows.append(row)
    return rows


def _columns() -> list[Column]:
    cols: list[Column] = [
        Column("model", "model"),
        Column("ppl", "PPL", "f4"),
        Column("ppl_err", "PPL ±", "f4"),
        SigColumn("ln_ppl_ratio", "ln(PPL/PPL base)", numeric=True),
        SigColumn("ln_ppl_ratio_err", "ln ratio ±", numeric=True),
        SigColumn("kld_mean", "KLD mean", numeric=True),
        SigColumn("kld_mean_err", "KLD ±", numeric=True),
    ]
    for key, label in KLD_PERCENTILES:
        cols.append(SigColumn(f"kld_{key}", f"KLD {label}", numeric=True))
    cols += [
        SigColumn("kld_max", "KLD max", numeric=True),
        SigColumn("delta_p_mean", "Δp mean (%)", numeric=True, decimals=3),
        SigColumn("delta_p_rms", "Δp RMS (%)", numeric=True, decimals=3),
        SigColumn("same_top_p", "same top (%)", numeric=True, decimals=3),
    ]
    return cols


def build(data: dict[str, Any]) -> Report:
    """The Report of a quant-eval data dict (``llamacpp_instr.running.quant.evaluate``'s
    ``evaluate_quants``), with the per-layer error where it holds one."""
    base = data["base"]
    facts = [
        Fact("text", _name(data["text"])),
        Fact("tokens in text", data["tokens"], "int"),
        Fact("context (--ctx)", data["ctx"], "int"),
        Fact("chunks", data["chunks"], "int"),
        Fact("tokens scored", data["tokens_scored"], "int"),
        Fact("vocabulary", data["n_vocab"], "int"),
        Fact("base", _name(base["path"])),
        Fact("PPL(base)", f"{base['ppl']:.4f} ± {base['ppl_err']:.4f}"),
        Fact("KV cache", _caches(data)),
        Fact("flash attention", _on_off(data.get("flash_attn", "auto"))),
        Fact("llama.cpp", data.get("llama_cpp_commit", "")),
    ]
    table = Table(
        name="models",
        title="Perplexity and KL divergence against the base",
        columns=_columns(),
        rows=_rows(data),
        note="PPL ± and the other ± are standard errors (llama-perplexity's uncertainties); "
        "ln(PPL/PPL base) as llama-perplexity's second pass computes it (the base's "
        "log-probabilities floored at the logit max − 16, as in its base file); KLD = KL(base ‖ "
        "quant) in nats per token; Δp = p(correct token | quant) − p(correct token | base); same "
        "top = the quant's most likely token is the base's.",
    )
    chart = Chart(
        name="kld_percentiles",
        kind="bars",
        title="KL divergence percentiles per model",
        x_label="KL divergence (nats)",
        y_label="model",
        categories=[_model_name(m) for m in data["models"]],
        series=[
            Series(f"KLD {label}", [m["kld"][key] for m in data["models"]])
            for key, label in KLD_PERCENTILES
        ],
        value_fmt="f4",
        note="Per scored token, KL(base || quant); the 99.9th percentile shows the rare tokens "
        "where the quant goes most wrong.",
    )
    n = data["tokens_scored"]
    text = (
        f"Each chunk of {data['ctx']} tokens is evaluated from an empty KV cache; only its second "
        f"half is scored ({n} tokens in {data['chunks']} chunks), as llama-perplexity does."
    )
    section = Section(title="Against the base", charts=[chart], tables=[table], text=text)
    sections = [section] + _by_position(data)
    if "layers" in data:  # where the error enters (quant-eval --layers)
        from .layers_report import layers_sections

        sections += layers_sections(data["layers"], Path(base["path"]).name)
    return Report(
        title="Quantization quality: perplexity and KL divergence",
        subtitle=f"{len(data['models'])} model(s) against {_name(base['path'])}",
        facts=facts,
        sections=sections,
        warnings=list(data.get("warnings", [])),
        data=data,
        csv_table="models",
    )


def _on_off(flag: Any) -> str:
    return "on" if flag is True else "off" if flag is False else str(flag)


def _caches(data: dict[str, Any]) -> str:
    kinds = {(m.get("type_k", "f16"), m.get("type_v", "f16")) for m in data["models"]}
    quants = ", ".join(f"K {k}, V {v}" for k, v in sorted(kinds))
    return f"base f16; compared: {quants}"


def _by_position(data: dict[str, Any]) -> list[Section]:
    """The KL divergence by context position: a line per model over the bins' middles, and the
    table (one row per bin, a column per model)."""
    models = [m for m in data["models"] if m.get("kld_by_position")]
    if not models:
        return []
    bins = models[0]["kld_by_position"]
    names = [_model_name(m) for m in models]
    rows = []
    for i, b in enumerate(bins):
        row: dict[str, Any] = {"positions": f"{b['first']}-{b['last']}", "tokens": b["tokens"]}
        for k, m in enumerate(models):
            row[f"kld_{k}"] = m["kld_by_position"][i]["mean"]
            row[f"err_{k}"] = m["kld_by_position"][i]["err"]
        rows.append(row)
    cols: list[Column] = [Column("positions", "positions"), Column("tokens", "tokens", "int")]
    for k, name in enumerate(names):
        cols += [
            SigColumn(f"kld_{k}", f"KLD mean: {name}", numeric=True),
            SigColumn(f"err_{k}", "±", numeric=True),
        ]
    chart = Chart(
        name="kld_by_position",
        kind="line",
        title="Mean KL divergence by context position",
        x_label="position in the chunk (tokens of context seen - 1)",
        y_label="KL divergence (nats)",
        x=[(b["first"] + b["last"]) / 2 for b in bins],
        series=[
            Series(name, [b["mean"] for b in m["kld_by_position"]])
            for name, m in zip(names, models, strict=True)
        ],
        value_fmt="f4",
    )
    table = Table(
        name="kld_by_position",
        title="Mean KL divergence by context position",
        columns=cols,
        rows=rows,
        note="The logits at position p have seen p + 1 tokens; ± is the mean's standard error.",
        whole=True,
    )
    text = (
        f"Each chunk's positions {bins[0]['first']}-{bins[-1]['last']} in {len(bins)} bins, over "
        f"{data['chunks']} chunks: a quantized KV cache's error builds up with the tokens it holds"
        + (" (--all-positions: the first half too)." if bins[0]["first"] == 0 else ".")
    )
    return [Section(title="By context position", charts=[chart], tables=[table], text=text)]
