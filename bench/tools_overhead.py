"""What a session costs llama.cpp's own benchmark: llama-bench's t/s, stock vs patched.

    python bench/tools_overhead.py [--model GGUF] [-p 128] [-n 32] [-r 3] [--rounds 9]
                                   [--threads 2] [--write-docs]

Builds (cached) the stock llama-bench of the pin and the patched one (`instr build --tools`), then
runs, interleaved round by round so that drift of the machine hits every configuration alike:

- stock:    the unpatched llama-bench;
- off:      the patched one, LLAMA_INSTR_LOG unset;
- minimal, detailed, verbose: the patched one with LLAMA_INSTR_LOG set at that level.

Each run is one `llama-bench -p P -n N -r R -o json` (its own warm-up, then R repetitions); the
t/s of each test is llama-bench's own figure (its mean over the repetitions). Prints, per
configuration and test, the median t/s and two ratios to stock: of the medians, and the median of
the per-round ratios (each round's run against that round's stock run, so that a slow minute of
the machine cancels out) with a bootstrap 95 % interval, and the targets (off >= 0.99x, detailed >= 0.97x), as a markdown
table; `--write-docs` puts it in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llamacpp_instr.native import models, tools  # noqa: E402

LEVELS = ("minimal", "detailed", "verbose")
TARGETS = {"off": 0.99, "detailed": 0.97}


def echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_bench(exe: Path, args: list[str], log: Path | None, level: str | None) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_INSTR_")}
    if log is not None and level is not None:
        env["LLAMA_INSTR_LOG"] = str(log)
        env["LLAMA_INSTR_LEVEL"] = level
    r = subprocess.run(
        [str(exe), *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if r.returncode != 0:
        raise SystemExit(f"llama-bench failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    out = {}
    for t in json.loads(r.stdout):
        name = f"pp{t['n_prompt']}" if t["n_prompt"] else f"tg{t['n_gen']}"
        out[name] = float(t["avg_ts"])
    return out


def interval(ratios: list[float], n: int = 2000, share: float = 0.95) -> tuple[float, float]:
    """A bootstrap interval (``share``: 95 % unless said) of the median of ``ratios`` (resampled
    with a fixed seed): how far the machine's run-to-run noise leaves the figure uncertain."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(n))
    tail = (1 - share) / 2
    return meds[int(tail * n)], meds[int((1 - tail) * n) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("-p", type=int, default=128, help="prompt tokens (pp test)")
    ap.add_argument("-n", type=int, default=32, help="generated tokens (tg test)")
    ap.add_argument("-r", type=int, default=3, help="llama-bench repetitions per run")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--configs",
        default="stock,off," + ",".join(LEVELS),
        help="configurations to run (comma-separated; stock first)",
    )
    ap.add_argument("--write-docs", action="store_true", help="update docs/performance.md")
    args = ap.parse_args()
    model = args.model or models.default_model()

    stock = tools.build_tools(echo, programs=("llama-bench",), stock=True) / "llama-bench"
    patched = tools.build_tools(echo, programs=("llama-bench",)) / "llama-bench"
    bench_args = ["-m", str(model), "-p", str(args.p), "-n", str(args.n), "-r", str(args.r)]
    bench_args += ["-t", str(args.threads), "-o", "json"]

    configs = args.configs.split(",")
    if configs[0] != "stock" or not set(configs) <= {"stock", "off", *LEVELS}:
        raise SystemExit(f"--configs: stock first, then any of off, {', '.join(LEVELS)}")
    samples: dict[str, dict[str, list[float]]] = {c: {} for c in configs}
    with tempfile.TemporaryDirectory(prefix="tools-overhead-") as tmp:
        for k in range(args.rounds):
            for c in configs:
                log = Path(tmp) / f"{c}-{k}.log" if c in LEVELS else None
                exe = stock if c == "stock" else patched
                got = run_bench(exe, bench_args, log, c if log else None)
                for test, ts in got.items():
                    samples[c].setdefault(test, []).append(ts)
                echo(f"  {c}: " + ", ".join(f"{t} {v:.1f} t/s" for t, v in got.items()))
                if log is not None:
                    log.unlink()  # a new log per run: no run reads or appends another's
            echo(f"round {k + 1}/{args.rounds} done")

    tests = list(samples["stock"])
    assert tests, "llama-bench reported no test"
    lines = [
        f"llama-bench on {model.name}, {args.rounds} interleaved rounds, -p {args.p} -n {args.n} "
        f"-r {args.r} -t {args.threads}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores",
        "",
        "| configuration | "
        + " | ".join(f"{t} t/s (median)" for t in tests)
        + " | vs stock (of the medians) | vs stock (median of per-round ratios, 95 % interval) |",
        "|---|" + "---|" * (len(tests) + 2),
    ]
    base = {t: statistics.median(samples["stock"][t]) for t in tests}
    for c in configs:
        med = {t: statistics.median(samples[c][t]) for t in tests}
        ratios = {
            t: [x / s for x, s in zip(samples[c][t], samples["stock"][t], strict=True)]
            for t in tests
        }
        paired = {t: statistics.median(r) for t, r in ratios.items()}
        spread = {t: interval(r) for t, r in ratios.items()}
        target = f" (target >= {TARGETS[c]}x)" if c in TARGETS else ""
        lines.append(
            f"| {c} | "
            + " | ".join(f"{med[t]:.1f}" for t in tests)
            + " | "
            + ", ".join(f"{t} {med[t] / base[t]:.3f}x" for t in tests)
            + " | "
            + ", ".join(
                f"{t} {paired[t]:.3f}x ({spread[t][0]:.3f}-{spread[t][1]:.3f})" for t in tests
            )
            + f"{target} |"
        )
    report = "\n".join(lines)
    print(report)
    if args.write_docs:
        sys.path.insert(0, str(ROOT / "bench"))
        from overhead import write_section

        write_section("tools", report, script="bench/tools_overhead.py")


if __name__ == "__main__":
    main()
