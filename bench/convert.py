"""Converter speed and memory: each command on a big log vs merely parsing it with orjson.

    python bench/convert.py [--ops 1000000] [--reps 3] [--tasks parse,pftrace,...] [--write-docs]
    python bench/convert.py --devices-only [--device-ops 200000] [--keep DIR]

Builds a large log shaped like a real DETAILED SmolLM2 log by repeating the generation steps of a
real one (tests/fixtures are too small; a real run of the bundled model is made first when no
--source is given), with steps renumbered and timestamps shifted so the result is a valid,
monotonic session. Then, each in a fresh process: a bare orjson parse of every line, `instr
to-perfetto` (Perfetto, Chrome JSON), `load_session`, `instr summary`, `instr export --workloads` and
`instr export`, at two sizes to show whether memory stays flat as the log grows.

Then device logs against a CPU log, two sets, each log's generation steps replicated the same
way to ``--device-ops`` ops (and a quarter and five times as many), `instr to-perfetto` and
`load_session` on each, interleaved round after round; the table shows the ratio of each device
log's ops/s to its set's CPU log's (× CPU). It has no target (0.8 would be one): what any
optimization of the device slices could gain is bounded by ``bench/convert_bound.py``
(docs/performance.md). The sets:

* real runs of SmolLM2-135M (605 ops a step): on the CPU; offloading 20 layers to two RPC servers
  (stand-ins serving this machine's CPU on loopback, ``rpc_standin``); offloading 15 layers to
  Vulkan0 (with the Vulkan build, `instr build --vulkan --no-install`; lavapipe here);
* the tests' tiny-llama fixtures (46 ops a step, so a step's own records weigh 13 times more
  per op): CPU, two RPC servers, Vulkan partial offload.

``--devices-only`` runs that part alone.

Each command is timed from the start of its process to its end, imports included (the library
call `load_session` from after its imports), with Python's
bytecode cache on as in an installed package (this sandbox sets PYTHONDONTWRITEBYTECODE; the
children do not inherit it, and a first child compiles everything). The median of ``--reps`` runs
is shown; the machine is shared, so single runs vary by 10% or more. Peak RSS is the process's
own high-water mark (VmHWM): ``ru_maxrss`` would count the forking parent's memory too.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
# task: (what it is, the instr arguments after LOG, or None)
TASKS: dict[str, tuple[str, list[str] | None]] = {
    "parse": ("orjson parse of every line (the floor)", None),
    "pftrace": ("`instr to-perfetto`", ["-o", "{out}.pftrace"]),
    "json": ("`instr to-perfetto --format json`", ["-o", "{out}.json", "--format", "json"]),
    "frames": ("`load_session` (the tables; after its imports)", None),
    "summary": ("`instr summary`", []),
    "workloads": ("`instr export --workloads`", ["--workloads", "-o", "{out}.jsonl"]),
    "export": ("`instr export` (Parquet)", ["-o", "{out}-tables"]),
}
COMMANDS = {"pftrace": "to-perfetto", "json": "to-perfetto", "workloads": "export"}
# the device-vs-CPU comparison: each fixture's generation steps replicated alike
FIXTURES = ROOT / "tests" / "fixtures"
DEVICE_LOGS = {
    "CPU": "tiny-llama-detailed",
    "RPC, two servers": "tiny-llama-rpc2-detailed",
    "Vulkan, partial offload": "tiny-llama-vulkan-partial-detailed",
}
# the SmolLM2 runs: label -> `instr run` options (Vulkan: with the Vulkan build only)
SMOL_RUNS = {
    "CPU": [],
    "RPC, two servers": ["-ngl", "20", "--rpc", "{rpc}"],
    "Vulkan, partial offload": ["-ngl", "15", "--device", "Vulkan0"],
}
DEVICE_TASKS = ("pftrace", "frames")
sys.path.insert(0, str(ROOT))


def make_source(tmp: Path) -> Path:
    from llamacpp_instr.native import models
    from llamacpp_instr.running import runner

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


def smol_sources(tmp: Path) -> tuple[dict[str, Path], list[str]]:
    """The SmolLM2 runs of ``SMOL_RUNS`` (each a fresh process: a registered RPC device stays for
    the process's life), and notes on any that could not run."""
    from llamacpp_instr.native import build, models
    from llamacpp_instr.running import rpc_standin
    from llamacpp_instr.running.vulkan_env import lavapipe_env

    logs: dict[str, Path] = {}
    notes: list[str] = []
    for label, extra in SMOL_RUNS.items():
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        if "--rpc" in extra:
            extra = [a.format(rpc=",".join(rpc_standin.endpoints(2))) for a in extra]
        if "Vulkan0" in extra:
            lib = build.vulkan_lib_dir(lambda _: None, build_it=False)
            if lib is None:
                notes.append(f"{label}: skipped, no Vulkan build (`instr build --vulkan`)")
                continue
            env = lavapipe_env(lib, base=env)
        log = tmp / f"smol-{len(logs)}.log"
        cmd = [sys.executable, "-m", "llamacpp_instr.cli", "run", str(models.default_model())]
        cmd += ["-p", "The history of the printing press begins", "-n", "24", "-t", "2"]
        cmd += ["--ctx", "512", "--level", "detailed", "--ignore-eos", "-o", str(log), *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            notes.append(f"{label}: the run failed: {r.stderr.strip()[-200:]}")
            continue
        logs[label] = log
    return logs, notes


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
    if task == "frames":  # a library call, in a program that has imported it (pandas: ~0.3 s)
        from llamacpp_instr import load_session
    t0 = time.perf_counter()
    if task == "frames":
        f = load_session(log)
        assert len(f.ops) > 0
    elif task == "parse":
        with open(log, "rb") as fh:
            for line in fh:
                orjson.loads(line)
    elif task == "warm":  # compile every module the others import
        import llamacpp_instr.cli  # noqa: F401
        from llamacpp_instr.converters.analysis import frames  # noqa: F401
        from llamacpp_instr.converters.formats import perfetto  # noqa: F401
        from llamacpp_instr.converters.reports import summary  # noqa: F401
    else:
        from click.testing import CliRunner

        from llamacpp_instr.cli import main

        extra = [a.format(out=out) for a in TASKS[task][1] or []]
        r = CliRunner().invoke(main, [COMMANDS.get(task, task), log, *extra])
        assert r.exit_code == 0, r.output
    dt = time.perf_counter() - t0
    # all threads (the writer compresses on others) and the forked log reader
    cpu = sum(
        u.ru_utime + u.ru_stime
        for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )
    hwm = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmHWM:")
    )
    print(json.dumps({"task": task, "s": dt, "rss": hwm, "cpu": cpu}))


def measure(task: str, log: Path, out: Path) -> dict:
    """One run of ``task`` in a new process, writing a new file: replacing an existing one makes
    ext4 flush the new data first (about 0.1 s per 300 MB), the filesystem's cost on overwrite."""
    for p in out.parent.glob(out.name + "*"):
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    r = subprocess.run(
        [sys.executable, __file__, "--child", task, "--log", str(log), "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


def output_bytes(task: str, out: Path) -> int | None:
    """The size of what the task wrote (a file, or a directory's files), if it writes one."""
    args = TASKS[task][1]
    if not args or "-o" not in args:
        return None
    p = Path(args[args.index("-o") + 1].format(out=out))
    if p.is_dir():
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return p.stat().st_size


def device_ratios(tmp: Path, target: int, reps: int, keep: Path | None = None) -> list[str]:
    """Per-op rates of ``to-perfetto`` and ``load_session`` on device logs against a CPU log, in
    two sets (the SmolLM2 runs, ``smol_sources``; the tests' fixtures), each log replicated to
    five times ``target`` ops (a log read on another core, as from ``prefetch.MIN_BYTES``; the
    main table shows memory at two sizes), the logs and tasks interleaved in every
    repetition so that the machine's noise hits them alike. ``keep``: a directory to leave the
    replicated logs in (to profile them), else they are deleted."""
    import gzip

    from llamacpp_instr.converters.reading import prefetch

    smol, notes = smol_sources(tmp)
    fixtures: dict[str, Path] = {}
    for label, name in DEVICE_LOGS.items():
        fixtures[label] = tmp / f"{name}.log"
        fixtures[label].write_bytes(gzip.decompress((FIXTURES / f"{name}.log.gz").read_bytes()))
    sets = {"SmolLM2-135M": smol, "tiny-llama": fixtures}
    lines = [
        "",
        "Device logs against a CPU log, in two sets: real runs of SmolLM2-135M (CPU; 20 "
        "layers on two RPC servers; 15 layers on Vulkan0, lavapipe here) and the tests' tiny-llama "
        "fixtures (CPU, two RPC servers, Vulkan partial offload), each log's generation steps "
        f"replicated the same way to {target * 5:,} ops; logs "
        f"and commands interleaved in each of {reps} rounds, medians. × CPU: the log's ops/s "
        "over its set's CPU log's, same command, same size (`to-perfetto` reads a log of "
        f"{prefetch.MIN_BYTES >> 20} MiB or more on a second core, `load_session` one of "
        f"{prefetch.TABLES_MIN_BYTES >> 20} MiB or more); by CPU "
        "time: the same ratio of CPU seconds (all threads and the log reader), steadier than wall "
        "time on a machine that others load.",
        *[f"- {n}" for n in notes],
        "",
        "| set | log | ops | command | s | ops/s | × CPU | CPU s | × CPU by CPU time | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    size = target * 5
    logs: dict[tuple[str, str], tuple[Path, int]] = {}
    for set_name, sources in sets.items():
        for label, src in sources.items():
            log = tmp / f"{src.stem}-{size}.log"
            logs[(set_name, label)] = (log, synthesize(src, size, log)[0])
    runs: dict[tuple[str, str, str], list[dict]] = {}
    for _ in range(reps):
        for task in DEVICE_TASKS:
            for (set_name, label), (log, _) in logs.items():
                out = tmp / f"dev-{task}"
                runs.setdefault((set_name, label, task), []).append(measure(task, log, out))
    for set_name, sources in sets.items():
        for task in DEVICE_TASKS:
            base = base_cpu = 0.0
            for label in sources:
                n_ops = logs[(set_name, label)][1]
                got = runs[(set_name, label, task)]
                sec = statistics.median(r["s"] for r in got)
                cpu = statistics.median(r["cpu"] for r in got)
                rate, rate_cpu = n_ops / sec, n_ops / cpu
                base, base_cpu = base or rate, base_cpu or rate_cpu
                rss = max(r["rss"] for r in got)
                lines.append(
                    f"| {set_name} | {label} | {n_ops:,} | {TASKS[task][0]} | {sec:.2f} | "
                    f"{rate:,.0f} | {rate / base:.2f} | {cpu:.2f} | "
                    f"{rate_cpu / base_cpu:.2f} | {rss / 2**20:.0f} MiB |"
                )
                print(lines[-1], file=sys.stderr)
    for log, _ in logs.values():
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.move(log, keep / log.name)
        else:
            log.unlink()
    return lines


def main_table(args: argparse.Namespace, tasks: list[str], tmp: Path, lines: list[str]) -> None:
    """The commands on a replicated SmolLM2 log (``--source``, or a run of the bundled model)."""
    source = args.source or make_source(tmp)
    measure("warm", source, tmp / "warm")
    for target in (args.ops // 4, args.ops):
        log = tmp / f"big-{target}.log"
        n_ops, _ = synthesize(source, target, log)
        floor = 0.0
        for task in tasks:
            out = tmp / f"out-{task}"
            runs = [measure(task, log, out) for _ in range(args.reps)]
            s = statistics.median(r["s"] for r in runs)
            cpu = statistics.median(r["cpu"] for r in runs)
            rss = max(r["rss"] for r in runs)
            floor = floor or s
            size = output_bytes(task, out)
            wrote = ""
            if size is not None:
                wrote = f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.1f} kB"
                wrote += f" ({size / n_ops:.0f} B/op)" if task == "pftrace" else ""
            lines.append(
                f"| {TASKS[task][0]} | {n_ops:,} | {s:.2f} | {n_ops / s:,.0f} | "
                f"{s / floor:.1f} | {cpu:.2f} | {rss / 2**20:.0f} MiB | {wrote} |"
            )
            print(lines[-1], file=sys.stderr)
        log.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3, help="runs per measurement (the median shows)")
    ap.add_argument("--source", type=Path, help="a real DETAILED log to replicate")
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument(
        "--tasks",
        default=",".join(TASKS),
        help="which measurements to run, comma-separated (default: %(default)s)",
    )
    ap.add_argument(
        "--device-ops",
        type=int,
        default=200_000,
        help="ops of the device-vs-CPU comparison (0: skip it)",
    )
    ap.add_argument(
        "--devices-only",
        action="store_true",
        help="only the device-vs-CPU comparison",
    )
    ap.add_argument(
        "--keep",
        type=Path,
        help="leave the device comparison's replicated logs in this directory (to profile them)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--log", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.log, args.out)
        return

    tasks = [t for t in args.tasks.split(",") if t]
    unknown = set(tasks) - set(TASKS)
    if unknown:
        ap.error(f"--tasks: unknown {', '.join(sorted(unknown))}")
    if "parse" not in tasks:
        tasks.insert(0, "parse")  # the floor every ratio is taken against
    lines = [
        "Synthetic DETAILED logs made by repeating a real SmolLM2-135M generation step; each "
        f"command in its own process, the median of {args.reps} runs, imports included. "
        "× parse: its time over a bare orjson parse of the same log.",
        "",
        "| command | ops | s | ops/s | × parse | CPU s | peak RSS | output |",
        "|---|---|---|---|---|---|---|---|",
    ]
    devices: list[str] = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        if args.devices_only:
            measure("warm", FIXTURES / f"{DEVICE_LOGS['CPU']}.log.gz", tmp / "warm")
        else:
            main_table(args, tasks, tmp, lines)
        if args.device_ops:
            devices = device_ratios(tmp, args.device_ops, args.reps, args.keep)

    report = "\n".join(lines)
    if not args.devices_only:
        print(report)
    print("\n".join(devices))
    if args.write_docs:
        from overhead import write_section

        if not args.devices_only:
            write_section("convert", report)
        if devices:  # (its own section: a run with --devices-only leaves the table above)
            write_section("convert_devices", "\n".join(devices).strip(), script="bench/convert.py")


if __name__ == "__main__":
    main()
