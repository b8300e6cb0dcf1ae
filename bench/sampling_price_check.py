"""Sampling as `instr predict` prices it, against real llama-server runs at 1, 4 and 8 slots.

    python bench/sampling_price_check.py [--slots 1,4,8] [--waves 12] [--n-predict 32] [--server PATH]
                                         [--keep DIR] [--write-docs]

The patched llama-server of `instr build --tools` (or `--server`), `-t 1`, at DETAILED, on a tiny
llama of a 131072-token vocabulary (tests/tiny_gguf.py: sampling costs what it costs on a real
vocabulary while its steps stay cheap), one server per slot count, all up for the whole bench.
Each wave sends a server its slots' worth of requests at once, each a JSON schema with repetition
penalties and DRY at temperature 0.8; the waves go to the servers in turn (`--waves` each, the
order rotating), so that the machine's drift meets every slot count alike.

The price (``deciding.prediction.sampling_price``) of N slots is measured on the logs of the runs
of fewer slots (the 1-slot run's own, for itself) and carried to N (each slot's token sampled one
after the other after the step, at the price of the nearest slot count measured below N); a second
row prices every run from the 1-slot run alone. Checked against each N-slot run:

* sampling per generation step: the price's N tokens against the run's own `host` records;
* generation: each request's time per token as the server's own `timings` say
  (`predicted_per_token_ms`: a step's period, each step giving each slot a token), against the
  same with the run's measured sampling per step replaced by the price's. The decode and the rest
  of the step are the run's own: the check isolates what the sampling price adds to a prediction
  (instr predict prices one sequence's decode).

Reported: each run's median error of both; the target is a median error of at most 15 %.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from helpers.tiny_gguf import write_big_vocab_model  # noqa: E402
from host_overhead import complete, echo, start  # noqa: E402

from llamacpp_instr.converters import load_session  # noqa: E402
from llamacpp_instr.deciding.prediction import sampling_price  # noqa: E402
from llamacpp_instr.native import tools  # noqa: E402


def one(port: int, i: int, n_predict: int) -> dict[str, Any]:
    return dict(complete(port, i, n_predict, dry_multiplier=0.8)["timings"])


def runs(
    exe: Path, model: Path, logs: dict[int, Path], args: argparse.Namespace
) -> dict[int, list[dict]]:
    """One server per slot count, all started first; each wave goes to every server in turn (the
    order rotating wave by wave), so that the shared machine's drift hits every run alike. Each
    request's `timings`, by slot count."""
    servers = {}
    try:
        for n, log in logs.items():
            servers[n] = start(exe, model, log, argparse.Namespace(parallel=n, threads=1))
        timings: dict[int, list[dict]] = {n: [] for n in logs}
        order = list(logs)
        for w in range(args.waves):
            for n in order[w % len(order) :] + order[: w % len(order)]:
                with ThreadPoolExecutor(n) as pool:
                    ids = range(w * n, (w + 1) * n)
                    jobs = [(servers[n][1], i, args.n_predict) for i in ids]
                    timings[n] += list(pool.map(lambda job: one(*job), jobs))
    finally:
        for proc, _ in servers.values():
            proc.send_signal(2)
            proc.communicate(timeout=120)
    return timings


def check(log: Path, price: sampling_price.SamplingPrice, slots: int, timings: list[dict]) -> dict:
    f = load_session(log)
    h = f.host.merge(f.steps[["ctx", "step", "n_tokens"]], on=["ctx", "step"])
    # the steps that decoded and sampled a token of every slot: the run's steady state
    full = h[(h["sampled"] == slots) & (h["n_tokens"] == slots)]
    # a mean, as the price is: a few tokens' grammar full passes weigh what they cost
    measured = float(full["sample_ns"].mean())
    priced = slots * price.at(slots=slots)["sampling_ms_per_token"] * 1e6
    server = [float(t["predicted_per_token_ms"]) for t in timings]
    # each request's time per token, its sampling as measured replaced by the price's
    predicted = [ms + (priced - measured) / 1e6 for ms in server]
    errors = [abs(p - ms) / ms for p, ms in zip(predicted, server, strict=True)]
    return {
        "slots": slots,
        "steps": len(full),
        "sampling_measured_ms": measured / 1e6,
        "sampling_priced_ms": priced / 1e6,
        "sampling_error": abs(priced - measured) / measured,
        "per_token_predicted_ms": statistics.median(predicted),
        "per_token_server_ms": statistics.median(server),
        "generation_error": statistics.median(errors),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", default="1,4,8")
    ap.add_argument("--waves", type=int, default=12)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--server", type=Path, default=None, help="a llama-server to run instead")
    ap.add_argument("--keep", type=Path, default=None, help="write the runs' logs here")
    ap.add_argument("--write-docs", action="store_true", help="update docs/accuracy.md")
    args = ap.parse_args()
    slots = [int(x) for x in args.slots.split(",")]
    exe = args.server or tools.build_tools(echo, programs=("llama-server",)) / "llama-server"
    rows = []
    with tempfile.TemporaryDirectory(prefix="sampling-price-") as scratch:
        tmp = args.keep or scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        model = write_big_vocab_model(Path(tmp) / "big-vocab.gguf")
        logs = {n: Path(tmp) / f"slots-{n}.log" for n in slots}
        timings = runs(exe, model, logs, args)
        frames = {n: load_session(logs[n]) for n in slots}
        for n in slots:
            below = [frames[k] for k in slots if k < n] or [frames[n]]
            for basis, sessions in (
                ("runs below", below),
                (f"{slots[0]} slot", [frames[slots[0]]]),
            ):
                price = sampling_price.measure(sessions)
                if price is None:
                    raise SystemExit("a run recorded no sampling")
                row = check(logs[n], price, n, timings[n])
                rows.append(row | {"basis": basis, "from": price.measured_at(n)})
    lines = [
        f"llama-server, `-t 1`, `--level detailed`, on a tiny llama of a 131072-token vocabulary; "
        f"each server {args.waves} waves of as many requests as slots (the servers in turn), "
        f"each a JSON schema, repeat penalty 1.1, DRY 0.8, temperature 0.8, {args.n_predict} tokens at most; "
        f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end",
        "",
        "| slots | priced from | steps of | steps | sampling a step, measured (ms) | priced (ms) "
        "| error | ms a token, predicted | server's | median error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['slots']} | {r['basis']} | {r['from']} | {r['steps']} | "
            f"{r['sampling_measured_ms']:.3f} | {r['sampling_priced_ms']:.3f} | "
            f"{r['sampling_error']:.1%} | {r['per_token_predicted_ms']:.2f} | "
            f"{r['per_token_server_ms']:.2f} | {r['generation_error']:.1%} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.write_docs:
        from overhead import write_section

        write_section("sampling_price", text, script="bench/sampling_price_check.py")


if __name__ == "__main__":
    main()
