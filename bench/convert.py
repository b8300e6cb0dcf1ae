"""Converter speed and memory: `instr to-perfetto` vs merely parsing the same log with orjson.

    python bench/convert.py [--ops 1000000] [--write-docs]

Builds a large log shaped like a real DETAILED SmolLM2 log by repeating the generation steps of a
real one (tests/fixtures are too small; a real run of the bundled model is made first when no
--source is given), with steps renumbered and timestamps shifted so the result is a valid,
monotonic session. Then, each in a fresh process so peak RSS is its own: a bare orjson parse of
every line, the Perfetto conversion, and the Chrome JSON conversion. Run at two sizes to show
whether memory stays flat as the log grows.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("parse", "pftrace", "json", "frames")
NAN = float("nan")
NA = {"s": NAN, "rss": NAN, "cpu": NAN}  # a measurement not made (see --tasks)
sys.path.insert(0, str(ROOT))


def make_source(tmp: Path) -> Path:
    from llamacpp_instr import models, runner

    log = tmp / "source.log"
    cfg = runner.RunConfig(
        model=models.default_model(),
        prompt="The history of the printing press begins",
        n_predict=24,
        threads=2,
        n_ctx=512,
        level="detailed",
        out=log,
        ignore_eos=True,
    )
    runner.run(cfg)
    return log


def synthesize(source: Path, target_ops: int, out: Path) -> tuple[int, int]:
    """Repeat the source's generation steps until ``target_ops`` timed ops; returns (ops, steps)."""
    recs = [orjson.loads(line) for line in source.read_bytes().splitlines()]
    head = [r for r in recs if r["type"] in ("session_start", "graph")]
    begins = {r["step"]: r for r in recs if r["type"] == "step_begin" and r["kind"] == "gen"}
    # a generation step that reuses its graph: begin, compute, end
    step = next(s for s in sorted(begins) if s > min(begins))
    group = [r for r in recs if r.get("step") == step and r["type"] != "graph"]
    span = max(r["ts"] for r in group) - begins[step]["ts"] + 1000
    ops_per_step = sum(len(r.get("ops", [])) for r in group)
    n_steps = -(-target_ops // ops_per_step)
    t_last = max(r["ts"] for r in recs)
    with out.open("wb") as f:
        for r in head:
            f.write(orjson.dumps(r) + b"\n")
        for k in range(n_steps):
            shift = t_last - begins[step]["ts"] + k * span
            for r in group:
                r2 = dict(r)
                r2["ts"] = r["ts"] + shift
                r2["step"] = k
                if "t_start" in r2:
                    r2["t_start"] = r["t_start"] + shift
                f.write(orjson.dumps(r2) + b"\n")
        end = next(r for r in recs if r["type"] == "session_end")
        end = dict(end, ts=t_last + n_steps * span + 1)
        f.write(orjson.dumps(end) + b"\n")
    return n_steps * ops_per_step, n_steps


def child(task: str, log: str, out: str) -> None:
    t0 = time.perf_counter()
    if task == "frames":
        from llamacpp_instr.converters import load_session

        f = load_session(log)
        assert len(f.ops) > 0
    elif task == "parse":
        n = 0
        with open(log, "rb") as f:
            for line in f:
                orjson.loads(line)
                n += 1
    else:
        from click.testing import CliRunner

        from llamacpp_instr.cli import main

        fmt = "json" if task == "json" else "pftrace"
        r = CliRunner().invoke(main, ["to-perfetto", log, "-o", out, "--format", fmt])
        assert r.exit_code == 0, r.output
    dt = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    rss = usage.ru_maxrss * 1024
    cpu = usage.ru_utime + usage.ru_stime  # all threads (the writer compresses on others)
    print(json.dumps({"task": task, "s": dt, "rss": rss, "cpu": cpu}))


def measure(task: str, log: Path, out: Path) -> dict:
    r = subprocess.run(
        [sys.executable, __file__, "--child", task, "--log", str(log), "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--source", type=Path, help="a real DETAILED log to replicate")
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument(
        "--tasks",
        default=",".join(TASKS),
        help="which measurements to run, comma-separated (default: %(default)s); the table "
        "shows n/a for the others",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--log", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.log, args.out)
        return

    tasks = set(args.tasks.split(","))
    if not tasks <= set(TASKS):
        ap.error(f"--tasks: unknown {', '.join(sorted(tasks - set(TASKS)))}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        source = args.source or make_source(tmp)
        for target in (args.ops // 4, args.ops):
            log = tmp / f"big-{target}.log"
            n_ops, n_steps = synthesize(source, target, log)
            outs = {"pftrace": tmp / "t.pftrace", "json": tmp / "t.json"}
            res = {t: measure(t, log, outs.get(t, tmp / "x")) for t in TASKS if t in tasks}
            rows.append(
                {
                    "ops": n_ops,
                    "steps": n_steps,
                    "log_mb": log.stat().st_size / 1e6,
                    **{t: res.get(t, NA) for t in TASKS},
                    "pftrace_mb": outs["pftrace"].stat().st_size / 1e6 if "pftrace" in res else NAN,
                    "json_mb": outs["json"].stat().st_size / 1e6 if "json" in res else NAN,
                }
            )
            print(f"{n_ops} ops done", file=sys.stderr)
            log.unlink()

    lines = [
        "Synthetic DETAILED logs made by repeating a real SmolLM2-135M generation step "
        "(each process measured alone; peak RSS is the process's maximum resident set).",
        "",
        "| ops | log MB | orjson parse s | to-perfetto s | ratio | ops/s | to-perfetto CPU s | peak RSS parse | peak RSS to-perfetto | .pftrace MB | Chrome JSON s | Chrome JSON MB | load_session s | load_session peak RSS |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pf, parse = r["pftrace"], r["parse"]
        lines.append(
            f"| {r['ops']:,} | {r['log_mb']:.0f} | {parse['s']:.2f} | {pf['s']:.2f} | "
            f"{pf['s'] / parse['s']:.1f}x | {r['ops'] / pf['s']:,.0f} | {pf['cpu']:.2f} | "
            f"{parse['rss'] / 2**20:.0f} MiB | {pf['rss'] / 2**20:.0f} MiB | "
            f"{r['pftrace_mb']:.1f} ({r['pftrace_mb'] * 1e6 / r['ops']:.0f} B/op) | "
            f"{r['json']['s']:.1f} | {r['json_mb']:.0f} | "
            f"{r['frames']['s']:.1f} | {r['frames']['rss'] / 2**20:.0f} MiB |"
        )
    report = "\n".join(lines).replace("nan", "n/a")
    print(report)
    if args.write_docs:
        from overhead import write_section

        write_section("convert", report)


if __name__ == "__main__":
    main()
