"""How fast a device log could convert if its device slices cost nothing: a bound.

    python bench/convert_bound.py [--device-ops 200000] [--reps 7] [--write-docs]

Takes the SmolLM2-135M runs of ``bench/convert.py`` (CPU; 20 layers on two RPC servers; 15
layers on Vulkan0, with the Vulkan build) and makes two variants of each device log, changing
the log, not the converter:

* **without its device rows**: its computes' ``copies``, ``busy`` and ``remote`` rows and its
  ``transfers`` records (the network commands) taken out; the splits, and so the per-device
  parts of each compute, kept. What a device log costs beyond a CPU log once its copies,
  command buffers, server graphs and network commands are free;
* **devices hidden**: the session's machine lists the CPU alone, so the same records are read
  and decoded as they are, and laid out and written as a CPU log's (one compute slice, no
  device tracks). What is left once every device slice and part is free.

Each log's generation steps are replicated as ``bench/convert.py`` does, to ``--device-ops``
ops and five times as many, and ``instr to-perfetto`` runs on each, every log once a round, in
``--reps`` interleaved rounds (medians, and the fastest). × CPU is a log's ops/s over the CPU
log's, as in ``bench/convert.py``'s device table. No trace of a variant is one anybody gets: they
bound what optimizing the device slices can gain, why device logs have no per-op target (0.8 of
a CPU log's rate would be one; docs/performance.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from convert import DEVICE_LOGS, FIXTURES, measure, smol_sources, synthesize  # noqa: E402

ROW_FIELDS = ("copies", "busy", "remote")  # a compute's device rows (the splits stay)


def without_rows(src: Path, out: Path) -> None:
    """``src`` with its computes' device rows and its ``transfers`` records taken out."""
    with src.open("rb") as f, out.open("wb") as g:
        for line in f:
            rec = orjson.loads(line)
            if rec.get("type") == "transfers":
                continue
            if rec.get("type") == "compute":
                for k in ROW_FIELDS:
                    rec.pop(k, None)
            g.write(orjson.dumps(rec) + b"\n")


def devices_hidden(src: Path, out: Path) -> None:
    """``src`` with its machine listing its (first) CPU device alone."""
    with src.open("rb") as f, out.open("wb") as g:
        for line in f:
            rec = orjson.loads(line)
            if rec.get("type") == "session_start":
                devices = rec.get("machine", {}).get("devices", [])
                rec["machine"]["devices"] = [d for d in devices if d.get("type") == "cpu"][:1]
            g.write(orjson.dumps(rec) + b"\n")


def variants(smol: dict[str, Path], tmp: Path) -> dict[str, Path]:
    """The CPU log, then each device log and its two variants (label -> source log)."""
    out = {"CPU": smol["CPU"]}
    for label, src in smol.items():
        if label == "CPU":
            continue
        out[label] = src
        bare = tmp / f"{src.stem}-norows.log"
        without_rows(src, bare)
        out[f"{label}, without its device rows"] = bare
        hidden = tmp / f"{src.stem}-hidden.log"
        devices_hidden(src, hidden)
        out[f"{label}, devices hidden"] = hidden
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device-ops", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=7, help="interleaved rounds (medians show)")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    lines = [
        "Device logs against a CPU log, and the same device logs without their device rows "
        "(copies, command buffers, server graphs, network commands) and with their devices "
        "hidden (laid out as a CPU log): real runs of SmolLM2-135M replicated to "
        f"{args.device_ops:,} and {5 * args.device_ops:,} ops, `instr to-perfetto` on each, "
        f"{args.reps} interleaved rounds; s: the median (fastest in brackets); × CPU: ops/s over "
        "the CPU log's, of the medians.",
        "",
        "| log | ops | s | × CPU | CPU s |",
        "|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        measure("warm", FIXTURES / f"{DEVICE_LOGS['CPU']}.log.gz", tmp / "warm")
        smol, notes = smol_sources(tmp)
        if "CPU" not in smol or len(smol) < 2:
            raise SystemExit("convert_bound: the SmolLM2 runs failed: " + "; ".join(notes))
        sources = variants(smol, tmp)
        for size in (args.device_ops, 5 * args.device_ops):
            logs = {}
            for label, src in sources.items():
                log = tmp / f"{src.stem}-{size}.log"
                logs[label] = (log, synthesize(src, size, log)[0])
            runs: dict[str, list[dict]] = {label: [] for label in logs}
            for _ in range(args.reps):
                for label, (log, _) in logs.items():
                    runs[label].append(measure("pftrace", log, tmp / "bound"))
            base = 0.0
            for label, (log, n_ops) in logs.items():
                got = runs[label]
                sec = statistics.median(r["s"] for r in got)
                cpu = statistics.median(r["cpu"] for r in got)
                base = base or n_ops / sec
                lines.append(
                    f"| {label} | {n_ops:,} | {sec:.2f} ({min(r['s'] for r in got):.2f}) | "
                    f"{n_ops / sec / base:.2f} | {cpu:.2f} |"
                )
                print(lines[-1], file=sys.stderr)
                log.unlink()
        lines += [f"- {n}" for n in notes]
    print("\n".join(lines))
    if args.write_docs:
        from overhead import write_section

        write_section("convert_bound", "\n".join(lines), script="bench/convert_bound.py")


if __name__ == "__main__":
    main()
