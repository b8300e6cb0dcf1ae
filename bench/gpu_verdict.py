"""bench/gpu_check.sh's summary: each step's time and status, each check's figure against its
target, in one JSON file and a table.

    python bench/gpu_verdict.py JSON_DIR STEPS.tsv OUT.json [--budget S] [--seconds S] [--dry-run]

JSON_DIR holds the steps' figures (cost.json, cupti.json, ...), STEPS.tsv the steps (name, budget
s, seconds, status). A check whose figures are missing (its step cut, failed or left out of a dry
run) reads "not measured"; in a dry run (the CPU standing in for the GPU) no target is judged.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Figures = dict[str, Any]


@dataclass(frozen=True)
class Check:
    name: str
    target: str
    source: str  # the JSON file (without .json) the figure is read from
    # the figure as text and whether it meets the target (None: not judged)
    read: Callable[[Figures], tuple[str, bool | None]]


def _within(x: float | None, lo: float, hi: float) -> bool | None:
    return None if x is None else lo <= x <= hi


def _f(x: float | None, digits: int = 3) -> str:
    return "?" if x is None else f"{x:.{digits}f}"


def _faults(f: Figures) -> tuple[str, bool | None]:
    runs = min((v["runs"] for v in f.values()), default=0)
    bad = sum(v["failed"] for v in f.values())
    text = f"{bad} failed; runs per setting: " + ", ".join(f"{k} {v['runs']}" for k, v in f.items())
    return text, bad == 0 and runs >= 10 and len(f) == 6


def _cost_c(f: Figures) -> tuple[str, bool | None]:
    c = f["c_api"]
    text = f"MINIMAL {_f(c['minimal'])}x, DETAILED {_f(c['detailed'])}x (none: {_f(f['c_api_off_tok_s'], 1)} tok/s)"
    return text, c["minimal"] >= 0.99 and c["detailed"] >= 0.95


def _cost_py(f: Figures) -> tuple[str, bool | None]:
    py, d = f["llama_cpp_python"], f["py_minus_c"]
    text = (
        f"MINIMAL {_f(py['minimal'])}x ({d['minimal']:+.3f}), DETAILED {_f(py['detailed'])}x "
        f"({d['detailed']:+.3f}) against the C API's"
    )
    return text, abs(d["minimal"]) <= 0.02 and abs(d["detailed"]) <= 0.02


def _identical(f: Figures) -> tuple[str, bool | None]:
    t, lg = f["text_identical"], f["logits_bit_identical"]
    return f"text {t}, logits {lg}", bool(t and lg)


def _headline(f: Figures) -> tuple[str, bool | None]:
    p, g = f["prompt_ratio"], f["gen_ratio"]
    text = (
        f"prompt {_f(p)}x ({_f(f['summary_prompt_tok_s'], 1)} against {_f(f['bench_prompt_tok_s'], 1)}), "
        f"generation {_f(g)}x ({_f(f['summary_gen_tok_s'], 1)} against {_f(f['bench_gen_tok_s'], 1)})"
    )
    return text, bool(_within(p, 0.9, 1.1) and _within(g, 0.9, 1.1))


def _op_types(f: Figures) -> tuple[str, bool | None]:
    n, total = f["op_types_within_10pct"], f["op_types_total"]
    return f"{n} of {total}; all ops {_f(f['all_ops_ratio'])}x", total > 0 and n == total


def _cover(f: Figures) -> tuple[str, bool | None]:
    lo, hi = f.get("coverage_min"), f.get("coverage_max")
    text = f"min {_f(lo)}, median {_f(f.get('coverage_median'))}, max {_f(hi)}"
    return text, bool(_within(lo, 0.95, 1.02) and _within(hi, 0.95, 1.02))


def _copies(f: Figures) -> tuple[str, bool | None]:
    r = f["copy_ratio"]
    text = (
        f"{f['matched']} of {f['log_copies']} matched ({f['matched_bytes']} of "
        f"{f['log_copy_bytes']} bytes), time {_f(r)}x CUPTI's"
    )
    return text, _within(r, 0.9, 1.1)


def _regions(f: Figures) -> tuple[str, bool | None]:
    text = f"{f['regions']} regions in {f['computes']} computes; {f['spanning_ops']} ops span one"
    if f["spanning_examples"]:
        text += f" ({', '.join(f['spanning_examples'])})"
    return text, f["regions"] > 0 and f["spanning_ops"] == 0


def _all_streams(f: Figures) -> tuple[str, bool | None]:
    r = f["all_ops_ratio"]
    return f"{_f(r)}x CUPTI's op work on {f['streams_marked']} streams", _within(r, 0.9, 1.1)


def _sampling(f: Figures) -> tuple[str, bool | None]:
    text = (
        f"{_f(f['host_chain_us'], 0)} us against {_f(f['llama_perf_sampler_us'], 0)} "
        f"({_f(f['host_over_llama'])}x); {f['host_records']} host records, {f['host_sampled']} "
        f"sampled of {f['tokens']}; {f['chain_records']} chain records"
    )
    ok = f["within"] and f["host_sampled"] == f["tokens"] and f["chain_records"] >= 1
    return text, bool(ok)


def _moe(f: Figures) -> tuple[str, bool | None]:
    c, b = f["copy_ratio"], f["busy_ratio"]
    text = (
        f"copies {_f(c)}x ({f['matched']} of {f['log_copies']} matched); busy "
        f"{_f(f['log_busy_ns_per_step'] / 1e3, 1)} us a step against "
        f"{_f(f['cupti_busy_ns_per_step'] / 1e3, 1)} ({_f(b)}x); idle "
        f"{_f(f['log_idle_ns_per_step'] / 1e3, 1)} us against {_f(f['cupti_idle_ns_per_step'] / 1e3, 1)}"
    )
    return text, bool(_within(c, 0.9, 1.1) and _within(b, 0.9, 1.1))


CHECKS = (
    Check("no fault, 10 runs of each setting", "0 failed", "faults", _faults),
    Check("cost, C API loop, graphs on", "MINIMAL >= 0.99x, DETAILED >= 0.95x", "cost", _cost_c),
    Check("cost, llama-cpp-python's loop", "within 0.02 of the C API's", "cost", _cost_py),
    Check("greedy text and logits with a session", "identical", "cost", _identical),
    Check("op types against CUPTI", "each within 10 %", "cupti", _op_types),
    Check("ops' cover of each graph compute", "0.95-1.02", "cupti", _cover),
    Check("copies against CUPTI's memcpy records", "within 10 %", "cupti-copies", _copies),
    Check("GRAPH_OPT: ops spanning a concurrent region", "none", "graph-opt-regions", _regions),
    Check("GRAPH_OPT: all ops against CUPTI", "within 10 %", "graph-opt-cupti", _all_streams),
    Check("summary against llama-bench (defaults)", "within 10 %", "headline", _headline),
    Check("sampling against llama_perf_sampler", "within 2 % or 0.1 ms", "sampling", _sampling),
    Check("MoE --n-cpu-moe 4 against CUPTI", "within 10 %", "moe", _moe),
)


def read_steps(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            name, budget, seconds, status = line.split("\t")
            rows.append(
                {"step": name, "budget_s": int(budget), "seconds": int(seconds), "status": status}
            )
    return rows


def verdicts(figures: dict[str, Figures], dry: bool) -> list[dict[str, Any]]:
    out = []
    for c in CHECKS:
        f = figures.get(c.source)
        if f is None:
            text, met = "not measured", None
        else:
            try:
                text, met = c.read(f)
            except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
                text, met = f"unreadable ({type(exc).__name__}: {exc})", None
        out.append(
            {"check": c.name, "target": c.target, "measured": text, "met": None if dry else met}
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("json_dir", type=Path)
    ap.add_argument("steps", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--budget", type=int, default=540)
    ap.add_argument("--seconds", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    figures = {p.stem: json.loads(p.read_text()) for p in sorted(a.json_dir.glob("*.json"))}
    steps = read_steps(a.steps)
    checks = verdicts(figures, a.dry_run)
    doc = {
        "dry_run": a.dry_run,
        "budget_s": a.budget,
        "seconds": a.seconds,
        "steps": steps,
        "checks": checks,
        "figures": figures,
    }
    a.out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"### steps ({a.seconds}s of {a.budget}s)")
    for s in steps:
        print(f"{s['step']:>10}  {s['seconds']:>4}s (budget {s['budget_s']:>3}s)  {s['status']}")
    print("### checks" + (" (dry run: no target judged)" if a.dry_run else ""))
    for c in checks:
        mark = {True: "met", False: "MISSED", None: "-"}[c["met"]]
        print(f"{mark:>6}  {c['check']} ({c['target']}): {c['measured']}")


if __name__ == "__main__":
    main()
