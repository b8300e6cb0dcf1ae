"""Device logs against a CPU log in instructions (issue 38): the conversion's work, which a shared
machine's speed does not move.

    python bench/convert_work.py CPU_LOG DEVICE_LOG [DEVICE_LOG ...]
    python bench/convert_work.py --forked CPU_LOG DEVICE_LOG [DEVICE_LOG ...]

Each log is laid out and written as an uncompressed Perfetto trace (into memory), the collector
off as ``instr to-perfetto`` has it, in one process under callgrind (Debian's ``valgrind``), the log read in that process
(``LLAMACPP_INSTR_NO_PREFETCH=1``), with ``PYTHONHASHSEED=0`` and every module's bytecode written
first (a process that compiles its modules counts half a billion instructions more). The same run
on the tests' tiny CPU fixture (imports, a few steps) is taken away; what is left per op, over
the first log's, is the ratio (the target: at least 0.8). Repeated runs agree to about 0.2 %.
Where wall time moves by a fifth between rounds, this says whether a change did less work; it
does not say what two cores doing it at once make of it (``bench/convert.py`` does).

``--forked`` counts the two processes of a big log's conversion apart: the log read on the
other core as ``instr to-perfetto`` reads a log of ``prefetch.MIN_BYTES`` or more (valgrind
follows the fork), the trace's process and the reader each less the imports (the reader is
forked after them, and its count starts from the parent's). On two cores the conversion takes
at least the larger of the two, and at least half their sum: moving work from one to the other
can gain no more than that.

The logs are any sizes; ``bench/convert.py --devices-only --keep DIR`` leaves its replicated ones
in ``DIR``. A callgrind run takes about 80 times the conversion (20 s for 200k ops).
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "tests" / "fixtures" / "tiny-llama-detailed.log.gz"


def child(log: str) -> None:
    """Convert ``log`` (what callgrind counts) and print its number of ops, the cyclic collector
    off as ``instr to-perfetto`` has it (``commands.to_perfetto``)."""
    import gc
    import io

    gc.disable()
    sys.path.insert(0, str(ROOT))
    from llamacpp_instr.converters.session.fold import iter_events_packed
    from llamacpp_instr.converters.traces.items import LayoutStats, Selection
    from llamacpp_instr.converters.traces.layout import layout_bulk
    from llamacpp_instr.converters.traces.perfetto.writer import write_perfetto_fast

    stats = LayoutStats()
    items = layout_bulk(iter_events_packed(Path(log)), Selection(), stats)
    write_perfetto_fast(items, io.BytesIO(), compress=False)
    print(stats.ops)


def count(log: Path, forked: bool = False) -> tuple[int, int, int]:
    """The instructions of converting ``log`` in a fresh process, and its ops; ``forked``: the
    log read by a forked process as ``instr to-perfetto`` reads a big one, then the first count
    is the trace's process's and the last the reader's (0: it did not fork)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONHASHSEED="0")
    if forked:  # (a caller's own setting would keep the log in one process)
        env.pop("LLAMACPP_INSTR_NO_PREFETCH", None)
    else:
        env.update(LLAMACPP_INSTR_NO_PREFETCH="1")
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--child",
        str(log),
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    # "==PID== Collected : N" per process; the first PID valgrind names is the one it started
    got = dict(re.findall(r"==(\d+)== Collected : (\d+)", r.stderr))
    first = re.search(r"==(\d+)==", r.stderr)
    if r.returncode != 0 or first is None or first.group(1) not in got:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"convert_work: {log}: the run failed: {last}")
    main_pid = first.group(1)
    reader = [int(n) for pid, n in got.items() if pid != main_pid]
    return int(got[main_pid]), int(r.stdout.split()[-1]), reader[0] if reader else 0


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("logs", nargs="*", type=Path, help="the CPU log first, then device logs")
    ap.add_argument(
        "--forked",
        action="store_true",
        help="read each log on a forked process, and count the two processes apart",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    if len(args.logs) < 2:
        ap.error("give a CPU log and at least one device log")
    if shutil.which("valgrind") is None:
        raise SystemExit("convert_work: needs valgrind (Debian: apt install valgrind)")
    for log in args.logs:
        if not log.is_file():
            raise SystemExit(f"convert_work: {log}: no such file")
    compileall.compile_dir(ROOT / "llamacpp_instr", quiet=1)  # (see the module doc)
    base, _, _ = count(BASELINE)
    print(f"imports and {BASELINE.name}: {base / 1e9:.3f} G instructions")
    if args.forked:
        forked(args.logs, base)
        return
    print("| log | ops | instructions beyond those | per op | × the first |")
    print("|---|---|---|---|---|")
    first = 0.0
    for log in args.logs:
        n, ops, _ = count(log)
        per_op = (n - base) / max(ops, 1)
        first = first or per_op
        print(f"| {log.name} | {ops:,} | {(n - base) / 1e9:.3f} G | {per_op:,.0f} | "
              f"{first / per_op:.2f} |")  # fmt: skip


def forked(logs: list[Path], base: int) -> None:
    """``--forked``'s table: each process's count beyond the imports, and two ratios of the
    first log's larger count per op: over this log's larger one (the two processes as they
    split the work now), and over half its sum (the best any split of its work between two
    cores could give against the first as it runs)."""
    print(
        "| log | ops | trace's process | log reader | × the first, as split | × the first, evenly |"
    )
    print("|---|---|---|---|---|---|")
    first = 0.0
    for log in logs:
        n, ops, n_reader = count(log, forked=True)
        if not n_reader:
            if not first:  # (the ratios are against the first log's split)
                raise SystemExit(
                    f"convert_work: {log}: the first log must be read on a forked process, "
                    f"as logs of {prefetch_mib()} MiB or more are; this one was not"
                )
            print(f"| {log.name} | {ops:,} | not forked (under {prefetch_mib()} MiB) | | | |")
            continue
        a, b = (n - base) / max(ops, 1), (n_reader - base) / max(ops, 1)
        first = first or max(a, b)
        print(f"| {log.name} | {ops:,} | {(n - base) / 1e9:.3f} G | {(n_reader - base) / 1e9:.3f} G"
              f" | {first / max(a, b):.2f} | {first / ((a + b) / 2):.2f} |")  # fmt: skip


def prefetch_mib() -> int:
    sys.path.insert(0, str(ROOT))
    from llamacpp_instr.converters.reading import prefetch

    return prefetch.MIN_BYTES >> 20


if __name__ == "__main__":
    main()
