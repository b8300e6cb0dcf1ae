"""The bandwidth probe of `instr peaks` against an independent measurement on the same machine.

Compiles bench/triad.c (a STREAM-style triad and add in C, OpenMP, `cc -O3 -fopenmp`), then runs it
and the native probe (`llama_instr_probe_run`: a ggml ADD graph on the CPU backend) interleaved,
round after round, with the same array size and thread count, so that machine noise hits both
alike. Both count three arrays of bytes per pass (two read, one written):

    python bench/probe_vs_triad.py [--mib 256] [--rounds 5] [--threads 1,2] [--write-docs]

Reports, per thread count, each one's best and median GB/s over the rounds and the probe's ratio
to the triad; the matmul peaks of the same machine (`instr peaks`' default plan, at the largest
thread count) follow, for the record.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def compile_triad(out_dir: Path) -> Path:
    cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
    exe = out_dir / "triad"
    cmd = [cc, "-O3", "-fopenmp", str(ROOT / "bench" / "triad.c"), "-o", str(exe)]
    subprocess.run(cmd, check=True)
    return exe


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256, help="MiB per array (three arrays)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=5, help="timed passes per round, best counts")
    ap.add_argument(
        "--threads", default=f"1,{max(1, min(os.cpu_count() or 1, 8))}", help="comma-separated"
    )
    ap.add_argument("--write-docs", action="store_true", help="update docs/accuracy.md")
    args = ap.parse_args()

    from llamacpp_instr.converters.session.machine_peaks import machine_key
    from llamacpp_instr.native import bindings
    from llamacpp_instr.running import peak_probe as measure

    lib = bindings.load()
    n = args.mib << 18  # float32 elements per array
    counts = sorted({int(t) for t in args.threads.split(",")})
    got: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as d:
        exe = compile_triad(Path(d))
        for r in range(args.rounds):
            for th in counts:
                env = {**os.environ, "OMP_NUM_THREADS": str(th)}
                out = subprocess.run(
                    [str(exe), str(n), str(args.runs)],
                    env=env,
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                t = json.loads(out)
                p = lib.probe(bindings.PROBE_BANDWIDTH, 0, 0, th, n, 0, args.runs)
                assert p.bytes == t["bytes"], (p.bytes, t["bytes"])  # the same traffic counted
                for name, v in (
                    ("triad", t["bytes"] / t["triad_best_ns"]),
                    ("add", t["bytes"] / t["add_best_ns"]),
                    ("probe", p.bytes / p.best_ns),
                ):
                    got.setdefault((name, th), []).append(v)
                print(
                    f"round {r}, {th} threads: "
                    + ", ".join(f"{k} {got[(k, th)][-1]:.2f}" for k in ("triad", "add", "probe"))
                    + " GB/s",
                    file=sys.stderr,
                )
    top = counts[-1]
    mm = measure.measure(measure.Plan(n_threads=top, bandwidth_elements=1 << 20), lib)
    names = {
        "triad": "STREAM-style triad, C (`bench/triad.c`)",
        "add": "STREAM-style add, C",
        "probe": "`instr peaks` probe: ggml ADD on the CPU backend",
    }
    lines = [
        f"Machine: {machine_key(mm.machine, top)}; three arrays of {args.mib} MiB of float32, "
        f"{args.rounds} interleaved rounds of {args.runs} timed passes (best pass per round).",
        "",
        "| bandwidth (GB/s) | threads | best | median | probe / this, best | probe / this, median |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for th in counts:
        probe = got[("probe", th)]
        for k in ("triad", "add", "probe"):
            v = got[(k, th)]
            lines.append(
                f"| {names[k]} | {th} | {max(v):.2f} | {statistics.median(v):.2f} | "
                f"{max(probe) / max(v):.2f}x | "
                f"{statistics.median(probe) / statistics.median(v):.2f}x |"
            )
    lines += [
        "",
        f"Matmul peaks of the same machine, {top} threads (`instr peaks`' default plan: 2048 x "
        "2048 weight by 512 columns, best of 5), GFLOP/s, with the buffer type that held the "
        "weight:",
        "",
        "| type | GFLOP/s | buffer |",
        "|---|---:|---|",
    ]
    for rec in mm.measurements:
        if rec["what"] == "matmul":
            gf = rec["flops"] / rec["best_ns"]
            lines.append(f"| {rec['type']} | {gf:.1f} | {rec['buffer_type']} |")
    report = "\n".join(lines)
    print(report)
    if args.write_docs:
        from overhead import write_section

        write_section("peaks", report, script="bench/probe_vs_triad.py")


if __name__ == "__main__":
    main()
