"""`instr quant-eval` against llama.cpp's own `llama-perplexity --kl-divergence`, same inputs.

    python bench/perplexity_reference.py [--ctx 512] [--chunks 16] [--threads 2] [--work DIR]

1. Builds `llama-perplexity` from the pinned sdist, stock (`llamacpp_instr.native.tools.build_tools`
   with no patch applied: CMake, only that target, static, ccache when available). Cached under
   `<cache>/tools/`, so a second run starts at once.
2. Makes the models with `instr quantize` from the bundled SmolLM2-135M-Instruct (Q4_1): an F16
   base, and Q8_0 and Q4_K_M quantized from that F16 (cached in --work).
3. Runs `llama-perplexity -m BASE -f TEXT -c CTX --chunks N --kl-divergence-base FILE`, then for
   each quant `llama-perplexity -m QUANT --kl-divergence-base FILE --kl-divergence -c CTX
   --chunks N`, and parses the statistics it prints.
4. Runs `instr quant-eval BASE Q8_0 Q4_K_M --text TEXT --chunk-size CTX --chunks N --format json`.
5. Prints a markdown table: each statistic, ours, llama-perplexity's, and the relative difference;
   and the peak RSS of every process (os.wait4).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llamacpp_instr.native import pin  # noqa: E402
from llamacpp_instr.native.paths import cache_dir  # noqa: E402
from llamacpp_instr.running.quant import evaluate as quant_eval  # noqa: E402

QUANTS = ("q8_0", "q4_k_m")


def echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(
    cmd: list[str], log: Path | None = None, env: dict[str, str] | None = None
) -> tuple[str, int]:
    """Run ``cmd``; its stdout+stderr and its peak RSS in kB (from os.wait4)."""
    echo("$ " + " ".join(cmd))
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if log is not None:
        log.write_text(out)
    if proc.returncode != 0:
        tail = "\n".join(out.strip().splitlines()[-15:])
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}):\n{tail}")
    return out, usage.ru_maxrss


def build_perplexity(jobs: int) -> Path:
    """The stock llama-perplexity of the pin, built once and cached (`instr build --tools`'s
    build, without the patches)."""
    from llamacpp_instr.native import tools

    return tools.build_tools(echo, programs=("llama-perplexity",), stock=True, jobs=jobs) / (
        "llama-perplexity"
    )


def make_models(work: Path, threads: int) -> dict[str, Path]:
    from llamacpp_instr.native import models

    src = models.default_model()
    out = {"f16": work / "SmolLM2-135M-Instruct.F16.gguf"}
    out.update({q: work / f"SmolLM2-135M-Instruct.{q.upper()}.gguf" for q in QUANTS})
    for qtype, path in out.items():
        if path.is_file():
            continue
        source = src if qtype == "f16" else out["f16"]
        tmp = path.with_suffix(".partial")
        run(["instr", "quantize", str(source), "--type", qtype, "-o", str(tmp)]
            + ["--threads", str(threads)])  # fmt: skip
        tmp.rename(path)
    return out


_NUM = r"(-?[0-9.]+(?:e[-+]?\d+)?|-?nan|-?inf)"


def _grab(out: str, label: str, err: bool = False) -> float | tuple[float, float]:
    pat = re.escape(label) + r"\s*:?\s*" + _NUM + (r"\s*±\s*" + _NUM if err else "")
    m = re.search(pat, out)
    if not m:
        raise SystemExit(f"llama-perplexity printed no {label!r}")
    return (float(m.group(1)), float(m.group(2))) if err else float(m.group(1))


def parse_kld(out: str) -> dict[str, Any]:
    """The statistics a --kl-divergence run prints at the end (Δp and same top in %)."""
    ppl = _grab(out, "Mean PPL(Q)", True)
    base = _grab(out, "Mean PPL(base)", True)
    ratio = _grab(out, "Mean ln(PPL(Q)/PPL(base))", True)
    kld = _grab(out, "Mean    KLD", True)
    dp = _grab(out, "Mean    Δp", True)
    rms = _grab(out, "RMS Δp", True)
    same = _grab(out, "Same top p", True)
    assert isinstance(ppl, tuple) and isinstance(base, tuple) and isinstance(ratio, tuple)
    assert isinstance(kld, tuple) and isinstance(dp, tuple) and isinstance(rms, tuple)
    assert isinstance(same, tuple)
    return {
        "ppl": ppl[0],
        "ppl_err": ppl[1],
        "base_ppl": base[0],
        "base_ppl_err": base[1],
        "ln_ppl_ratio": ratio[0],
        "ln_ppl_ratio_err": ratio[1],
        "kld_mean": kld[0],
        "kld_mean_err": kld[1],
        "kld_median": _grab(out, "Median  KLD"),
        "kld_p90": _grab(out, "90.0%   KLD"),
        "kld_p95": _grab(out, "95.0%   KLD"),
        "kld_p99": _grab(out, "99.0%   KLD"),
        "kld_p99_9": _grab(out, "99.9%   KLD"),
        "kld_max": _grab(out, "Maximum KLD"),
        "delta_p_mean": dp[0],
        "delta_p_rms": rms[0],
        "same_top_p": same[0],
    }


def ours_flat(m: dict[str, Any]) -> dict[str, Any]:
    return {
        "ppl": m["ppl"],
        "ppl_err": m["ppl_err"],
        "base_ppl": m["base_ppl"],
        "ln_ppl_ratio": m["ln_ppl_ratio"],
        "ln_ppl_ratio_err": m["ln_ppl_ratio_err"],
        "kld_mean": m["kld"]["mean"],
        "kld_mean_err": m["kld"]["mean_err"],
        "kld_median": m["kld"]["median"],
        "kld_p90": m["kld"]["p90"],
        "kld_p95": m["kld"]["p95"],
        "kld_p99": m["kld"]["p99"],
        "kld_p99_9": m["kld"]["p99_9"],
        "kld_max": m["kld"]["max"],
        "delta_p_mean": 100.0 * m["delta_p"]["mean"],
        "delta_p_rms": 100.0 * m["delta_p"]["rms"],
        "same_top_p": m["same_top_p"],
    }


LABELS = {
    "ppl": "PPL(Q)",
    "ppl_err": "PPL(Q) uncertainty",
    "base_ppl": "PPL(base)",
    "ln_ppl_ratio": "ln(PPL(Q)/PPL(base))",
    "ln_ppl_ratio_err": "ln ratio uncertainty",
    "kld_mean": "mean KLD",
    "kld_mean_err": "mean KLD uncertainty",
    "kld_median": "median KLD",
    "kld_p90": "90% KLD",
    "kld_p95": "95% KLD",
    "kld_p99": "99% KLD",
    "kld_p99_9": "99.9% KLD",
    "kld_max": "max KLD",
    "delta_p_mean": "mean Δp (%)",
    "delta_p_rms": "RMS Δp (%)",
    "same_top_p": "same top p (%)",
}


def rel(a: float, b: float) -> str:
    if b == 0:
        return "–" if a == 0 else "n/a"
    return f"{(a - b) / abs(b) * 100:+.3f} %"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text", type=Path, default=quant_eval.default_text())
    ap.add_argument("--work", type=Path, default=cache_dir() / "bench-perplexity")
    ap.add_argument("--json", type=Path, default=None, help="Also write all numbers here.")
    args = ap.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    exe = build_perplexity(args.threads)
    paths = make_models(args.work, args.threads)
    common = ["-c", str(args.ctx), "--chunks", str(args.chunks), "-t", str(args.threads)]
    kld_file = args.work / f"base-ctx{args.ctx}-chunks{args.chunks}.kld"
    rss: dict[str, int] = {}
    t0 = time.monotonic()
    out, rss["llama-perplexity (base pass)"] = run(
        [str(exe), "-m", str(paths["f16"]), "-f", str(args.text), *common]
        + ["--kl-divergence-base", str(kld_file)],
        args.work / "ref-base.log",
    )
    m = re.search(r"Final estimate: PPL = " + _NUM + r" \+/- " + _NUM, out)
    if not m:
        raise SystemExit("llama-perplexity printed no final PPL for the base")
    ref_base = (float(m.group(1)), float(m.group(2)))
    ref: dict[str, dict[str, Any]] = {}
    for q in QUANTS:
        out, rss[f"llama-perplexity ({q})"] = run(
            [str(exe), "-m", str(paths[q]), "--kl-divergence-base", str(kld_file)]
            + ["--kl-divergence", *common],
            args.work / f"ref-{q}.log",
        )
        ref[q] = parse_kld(out)
    t_ref = time.monotonic() - t0

    t0 = time.monotonic()
    out, rss["instr quant-eval (3 models)"] = run(
        ["instr", "quant-eval", str(paths["f16"]), *(str(paths[q]) for q in QUANTS)]
        + ["--text", str(args.text), "--chunk-size", str(args.ctx), "--chunks", str(args.chunks)]
        + ["--threads", str(args.threads), "--format", "json"],
    )
    t_ours = time.monotonic() - t0
    ours = json.loads(out[out.index("{") :])
    ours_by = {q: ours_flat(m) for q, m in zip(QUANTS, ours["models"], strict=True)}

    lines = [
        f"llama.cpp {pin.LLAMA_CPP_COMMIT} (llama-cpp-python {pin.LLAMA_CPP_PYTHON_VERSION} sdist, "
        f"stock `llama-perplexity`); text {args.text.name}, ctx {args.ctx}, {ours['chunks']} "
        f"chunks, {ours['tokens_scored']} tokens scored, {args.threads} threads; llama-perplexity "
        f"{t_ref:.0f} s for the three passes, quant-eval {t_ours:.0f} s.",
        "",
        "| model | statistic | quant-eval | llama-perplexity | relative difference |",
        "|---|---|---:|---:|---:|",
        f"| F16 (base) | PPL (base pass) | {ours['base']['ppl']:.6f} | {ref_base[0]:.6f} | "
        f"{rel(ours['base']['ppl'], ref_base[0])} |",
        f"| F16 (base) | PPL uncertainty | {ours['base']['ppl_err']:.6f} | {ref_base[1]:.6f} | "
        f"{rel(ours['base']['ppl_err'], ref_base[1])} |",
    ]
    worst = 0.0
    for q in QUANTS:
        for key, label in LABELS.items():
            a, b = ours_by[q][key], ref[q][key]
            lines.append(f"| {q.upper()} | {label} | {a:.6f} | {b:.6f} | {rel(a, b)} |")
            if b and key not in ("delta_p_mean",):
                worst = max(worst, abs(a - b) / abs(b))
    lines += ["", "| process | peak RSS |", "|---|---:|"]
    lines += [f"| {k} | {v / 1024:.0f} MB |" for k, v in rss.items()]
    lines += ["", f"largest relative difference (all but mean Δp): {worst * 100:.3f} %"]
    print("\n".join(lines))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"ours": ours, "reference": ref, "reference_base": ref_base, "rss_kb": rss},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
