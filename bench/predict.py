"""``instr predict`` against real runs, leave one out.

Runs a grid of settings of SmolLM2-135M on this machine (threads, context depth, ubatch, weight
type), each a real detailed run, then predicts every cell from the logs of the *other* cells only
and compares the prediction with what the cell measured: prompt and generation tokens/s (tokens
over llama_decode time, per kind, as ``predict.measured`` reads a log).

    python bench/predict.py [--write-docs] [--gen N] [--quick | --vulkan | --rpc]
    python bench/predict.py --threads-grid --depth-grid [--write-docs] [--priority] [--reps N]

Targets: generation median absolute error at most 15 % and none over 35 %; prompt
median at most 20 %; ``predict`` answering in under 5 s from a detailed log of 100 steps (timed
here on the base cell's log); on the partial-offload and RPC cells, the predicted share of time
per device and network within 10 points of the measured share. On every grid
the measured value inside the printed interval in at least 90 % of the predictions, and the
median interval no wider than +-20 % of its point (the coverage line; a value outside is marked
(!)); on the CPU grid, each cell also from the logs of the other thread count only (1 thread from
the 2-thread logs and 2 from the 1-thread ones, with this machine's peaks at both: ``op_threads``),
median absolute error at most 20 % each way, prompt and generation.

``--threads-grid``: two models (the bundled SmolLM2-135M and a 12-layer F16 llama of
other shapes written with gguf, ``SECOND``), three prompt lengths, 1 and 2 threads; each cell
predicted from the one log of the same model and prompt at the other count (a user's single log)
with the peaks the bench measures at both: median absolute error at most 10 %, largest 20 %.
``--depth-grid``: the same two models, flash attention off and on, depths 512 to 4096 (the depth
filled before the session, as llama-bench's -d does, then a short prompt and generation), each
from ``instr run``'s log of the short prompt alone: median at most 15 %. Each cell runs --reps
times, the cells taking turns, and its median counts; a kind's predictions (prompt, generation)
are made from the source cell's run whose figure of that kind is the median (a short prompt is
one step: one run's can be a spike); a run whose steps spread like a busy
machine's is run again (--retry-busy); --priority runs the bench at nice -20 in a scheduling
group of its own, and the models are held in memory (a machine that pages out idle memory would
otherwise read the weights from disk in a run's first step).

``--vulkan``: -ngl 0, 15 and 30 on lavapipe (the bench runs itself again under the Vulkan
build of `instr build --vulkan --no-install`). ``--rpc``: two RPC servers, each on a host of its own
(a network namespace, tests/helpers/netsim.py: veth, tc tbf, a delay proxy; needs root), every layer
offloaded to them, the client and each server on 1 thread, at two link rates (``RPC_RATES``) and a
delay of ``RPC_DELAY_MS`` each way; each rate's cell is predicted from the other rate's log, given
the held-out link as ``--rpc-rate`` and ``--rpc-rtt`` would give it (the tbf rate, twice the delay).
Over RPC a step's time is its window (until its outputs are read: ``token_time``), as
``predict.measured`` reads such a log.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # netsim, rpc_backend (--rpc)

from llamacpp_instr.running.measuring import ThisMachine  # noqa: E402

KV_PAD = 256
RPC_RATES = (50.0, 200.0)  # Mbit/s: the network a large share of a token at both
RPC_DELAY_MS = 1.0  # each way
SHARE_SHOWN = 3  # points: a cell's shares of time are listed where one is off by this many


@dataclass(frozen=True)
class Cell:
    quant: str
    threads: int
    depth: int  # prompt tokens: the KV depth generation runs at
    ubatch: int
    ngl: int | None = None  # layers on Vulkan0 (the --vulkan grid) or the RPC servers
    rate: float | None = None  # Mbit/s: over RPC (the --rpc grid), the link's tbf rate

    @property
    def name(self) -> str:
        ngl = "" if self.ngl is None else f" ngl{self.ngl}"
        rpc = "" if self.rate is None else f" rpc {self.rate:g} Mbit/s"
        return f"{self.quant} t{self.threads} d{self.depth} ub{self.ubatch}{ngl}{rpc}"

    @property
    def file_name(self) -> str:
        return self.name.replace(" Mbit/s", "M").replace(" ", "_") + ".log"


GRID = [
    Cell("q4_1", 2, 128, 512),  # the base
    Cell("q4_1", 2, 1024, 512),
    Cell("q4_1", 2, 4096, 512),
    Cell("q4_1", 2, 1024, 32),
    Cell("q4_1", 2, 128, 32),
    Cell("q4_1", 1, 128, 512),
    Cell("q4_1", 1, 1024, 512),
    Cell("q4_1", 1, 128, 32),
    Cell("q8_0", 1, 128, 512),
    Cell("f16", 1, 128, 512),
    Cell("q8_0", 2, 128, 512),
    Cell("q8_0", 2, 1024, 512),
    Cell("f16", 2, 128, 512),
    Cell("f16", 2, 1024, 512),
]
QUICK = [c for c in GRID if c.depth <= 1024 and c.threads == 2 and c.quant == "q4_1"]
# on lavapipe (a Vulkan driver on the same 2 cores: SmolLM2 fully offloaded decodes at about 1.3
# tok/s), so short: the placement is what varies
VULKAN = [Cell("q4_1", 2, 128, 512, ngl) for ngl in (0, 15, 30)]
# over RPC the two servers and the client take a thread each, on 2 cores
RPC = [Cell("q4_1", 1, 128, 512, 99, rate) for rate in RPC_RATES]


def prompt_of(model: Path, n_tokens: int) -> str:
    """Text that the model's tokenizer makes ``n_tokens`` tokens of (give or take a merge)."""
    import llama_cpp

    llm = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    words = (Path(__file__).resolve().parent.parent / "README.md").read_text().split()
    text = " ".join(words * (1 + 4 * n_tokens // max(len(words), 1)))
    toks = llm.tokenize(text.encode(), add_bos=False)[: n_tokens - 1]
    return llm.detokenize(toks).decode(errors="ignore")


# a run in the client's namespace: instr run's runner, the servers named by ENDPOINTS
RPC_CLIENT = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from llamacpp_instr.running import offload, runner
cfg = runner.RunConfig(model=Path({model!r}), prompt={prompt!r}, n_predict={gen}, threads={threads},
    n_ctx={n_ctx}, n_batch=512, n_ubatch={ubatch}, level="detailed", out=Path({out!r}),
    ignore_eos=True, offload=offload.Offload(gpu_layers={ngl}, rpc=tuple({endpoints!r})))
runner.run(cfg)
print("{{}}")
"""


def run_rpc_cell(cell: Cell, model: Path, gen: int, out: Path) -> None:
    """A cell over RPC: two servers on hosts of their own behind links of the cell's rate."""
    from helpers import netsim
    from helpers.rpc_backend import lib_dir

    assert cell.rate is not None
    why = netsim.namespaces_available()
    if why:
        sys.exit(f"--rpc needs network namespaces: {why}")
    server = netsim.server_command(lib_dir(), "{endpoint}", threads=1)
    n_ctx = -(-(cell.depth + gen + 64) // KV_PAD) * KV_PAD
    with netsim.Network([(cell.rate, RPC_DELAY_MS, server)] * 2) as net:
        code = RPC_CLIENT.format(
            root=str(ROOT),
            model=str(model),
            prompt=prompt_of(model, cell.depth),
            gen=gen,
            threads=cell.threads,
            n_ctx=n_ctx,
            ubatch=cell.ubatch,
            out=str(out),
            ngl=cell.ngl,
            endpoints=list(net.endpoints),
        )
        net.run_client(code, timeout=900)


def run_cell(cell: Cell, model: Path, gen: int, out: Path) -> None:
    from llamacpp_instr.running import offload, runner

    if cell.rate is not None:
        run_rpc_cell(cell, model, gen, out)
        return

    n_ctx = -(-(cell.depth + gen + 64) // KV_PAD) * KV_PAD
    cfg = runner.RunConfig(
        model=model,
        prompt=prompt_of(model, cell.depth),
        n_predict=gen,
        threads=cell.threads,
        n_ctx=n_ctx,
        n_batch=512,
        n_ubatch=cell.ubatch,
        level="detailed",
        out=out,
        ignore_eos=True,
        offload=offload.Offload(gpu_layers=cell.ngl or 0),
    )
    runner.run(cfg)


def _times(log: Path) -> tuple[float, float]:
    """A run's prompt and generation times; over RPC, the devices' compute in them (the network's
    part is the link's, the same in every run of a cell: another process's burst slows only the
    compute)."""
    from llamacpp_instr.deciding.prediction.net_costs import is_rpc_log
    from llamacpp_instr.deciding.prediction.predict import load_session

    sf = load_session(log)
    if is_rpc_log(sf):
        tt = sf.token_time
        kinds = tt["kind"].astype(str)
        return tuple(  # type: ignore[return-value]
            float(tt.loc[kinds == k, "compute_ns"].sum()) for k in ("prompt", "gen")
        )
    kind = sf.steps["kind"].astype(str)
    return tuple(  # type: ignore[return-value]
        float(sf.steps.loc[kind == k, "dur_ns"].sum()) for k in ("prompt", "gen")
    )


def idle_share(seconds: float = 3.0) -> float:
    """The share of the CPUs' time idle over ``seconds`` (/proc/stat)."""

    def read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, all

    i0, t0 = read()
    time.sleep(seconds)
    i1, t1 = read()
    return (i1 - i0) / max(t1 - t0, 1)


def wait_idle(limit: float) -> float:
    """Wait up to ``limit`` seconds for the CPUs to be 80 % idle; the seconds waited."""
    start = time.monotonic()
    while limit > 0 and time.monotonic() - start < limit and idle_share() < 0.8:
        pass
    return time.monotonic() - start if limit > 0 else 0.0


def busy(log: Path) -> bool:
    """Whether a run's steps spread like a busy machine's (``contention.verdict``)."""
    from llamacpp_instr.converters.analysis import contention
    from llamacpp_instr.deciding.prediction.predict import load_session

    return bool(contention.verdict(load_session(log).steps).flagged)


def slowness(log: Path, attempts: list[Path]) -> float:
    """A run's prompt and generation times, each over the fastest attempt's: the run kept is the
    one least slowed in both."""
    times = [_times(a) for a in attempts]
    mine = _times(log)
    return sum(m / max(min(t[i] for t in times), 1.0) for i, m in enumerate(mine))


# the fits of sets of the grid's sessions, shared by the cells' predictions (op_fit.fit's memo)
MEMO: dict[Any, Any] = {}
# this machine's measures (the graphs llama.cpp builds, the probes), handed to the predictor
MACHINE = ThisMachine()


def predict_cell(
    cell: Cell,
    others: list[Cell],
    sessions: dict[Cell, Any],
    model_file: Path,
    peaks: Path | None = None,
) -> tuple[Cell, Any, dict[str, float | None], dict[str, dict[str, float]]]:
    """``cell`` predicted from the logs of ``others`` only, with what it measured; ``peaks``:
    the cache of this machine's peaks (another thread count than the others')."""
    from llamacpp_instr.deciding.prediction import predict

    model = predict.fit([sessions[c] for c in others], memo=MEMO, peaks_dir=peaks, machine=MACHINE)
    target = predict.default_target(sessions[cell], model_file)
    if cell.rate is not None:
        # the held-out cell's link, as a user would give it: its rate and round trip
        target = replace(target, rpc_rate=cell.rate * 1e6, rpc_rtt_ns=2 * RPC_DELAY_MS * 1e6)
    p = predict.price(target, model, [sessions[c] for c in others], [], MACHINE, peaks_dir=peaks)
    m = predict.measured(sessions[cell])
    shares = predict.measured_shares(sessions[cell])
    print(
        f"{cell.name} from {len(others)}: prompt {m['prompt']:.1f} vs "
        f"{p.prompt.value if p.prompt else None}, gen {m['gen']:.1f} vs "
        f"{p.gen.value if p.gen else None}; not covered: {len(p.not_covered)}",
        file=sys.stderr,
    )
    return cell, p, m, shares


def inside(iv: Any, meas: float | None) -> bool | None:
    """Whether the measured value is inside the printed interval (None: nothing to compare)."""
    if iv is None or not meas:
        return None
    return bool(iv.low <= meas <= iv.high)


def coverage_line(rows: list[Any]) -> str:
    """The share of the predicted cells whose measured value is inside the interval, per kind
    and in all, against the 90 % target; and what the intervals are made of."""
    got: dict[str, list[bool]] = {"prompt": [], "gen": []}
    bases: dict[str, int] = {}
    widths: list[float] = []
    for _cell, p, m, _shares in rows:
        for kind, iv in (("prompt", p.prompt), ("gen", p.gen)):
            hit = inside(iv, m[kind])
            if hit is not None:
                got[kind].append(hit)
                bases[iv.basis] = bases.get(iv.basis, 0) + 1
                widths.append(100 * (iv.high - iv.low) / (2 * iv.value))
    every = got["prompt"] + got["gen"]
    if not every:
        return "Interval coverage: no cell predicted."
    parts = ", ".join(f"{k} {sum(v)} of {len(v)}" for k, v in got.items() if v)
    made = ", ".join(f"{n} {b}" for b, n in sorted(bases.items()))
    return (
        f"Interval coverage: the measured value inside the printed interval in {sum(every)} of "
        f"{len(every)} predictions ({100 * sum(every) / len(every):.0f} %; {parts}; target: at "
        f"least 90 %); the median interval +-{statistics.median(widths):.1f} % of its point "
        f"(target: at most +-20 %). Intervals: {made} (intervals.py)."
    )


def report(rows: list[Any], thread_rows: list[Any]) -> list[str]:
    """The grid's table (each cell from the other cells; with ``thread_rows``, also from the
    logs of the other thread count only, beside it), the shares of time, the errors against the
    targets and the intervals' coverage."""
    across = dict(zip([r[0] for r in thread_rows], thread_rows, strict=True))
    head = "| cell (weights, threads, depth, ubatch) "
    for kind in ("prompt", "gen"):
        head += f"| {kind} tok/s measured | predicted (interval) | error "
        if across:
            head += "| from the other thread count | error "
    lines = [head + "|", "|---" * (7 + 4 * bool(across)) + "|"]
    errs: dict[str, list[float]] = {"prompt": [], "gen": []}
    way_errs: dict[tuple[str, str], list[float]] = {}
    for cell, p, m, _shares in rows:
        cols = [cell.name]
        for kind, iv in (("prompt", p.prompt), ("gen", p.gen)):
            e = pct(iv.value if iv else None, m[kind])
            if e is not None:
                errs[kind].append(abs(e))
            cols += cell_columns(iv, m[kind], e)
            if across:
                other = getattr(across[cell][1], kind)
                e = pct(other.value if other else None, m[kind])
                if e is not None:
                    way = "2 -> 1" if cell.threads == 1 else "1 -> 2"
                    way_errs.setdefault((way, kind), []).append(abs(e))
                cols += cell_columns(other, m[kind], e)[1:]
        lines.append("| " + " | ".join(cols) + " |")
    lines += share_lines(rows)
    lines.append("")
    for kind, target in (
        ("gen", "median at most 15 %, none over 35 %"),
        ("prompt", "median at most 20 %"),
    ):
        got = errs[kind]
        lines.append(
            f"{kind}: median absolute error {statistics.median(got):.1f} %, largest "
            f"{max(got):.1f} % ({len(got)} of {len(rows)} cells predicted) (target: {target})."
            if got
            else f"{kind}: no cell predicted."
        )
    lines.append(coverage_line(rows))
    if across:
        lines.append(
            "From the other thread count only (1 thread from the 2-thread logs, 2 from the "
            "1-thread ones; `op_threads`), median absolute error (target: at most 20 %): "
            + "; ".join(
                f"{way} {kind} {statistics.median(v):.1f} % (largest {max(v):.1f} %, {len(v)} "
                "cells)"
                for (way, kind), v in sorted(way_errs.items())
            )
            + "."
        )
        lines.append(coverage_line(thread_rows).replace("Interval coverage", "Their coverage"))
    lines.append(log_error_line(rows + thread_rows, "grid"))
    return lines


def share_lines(rows: list[Any]) -> list[str]:
    """Each device's own time and the copies' (over RPC: the network's) as shares of their sum,
    predicted against measured: the cells and kinds off by ``SHARE_SHOWN`` points or more, and
    the largest difference (none for a grid on one device)."""
    errs: list[float] = []
    out: list[str] = []
    for cell, p, _m, shares in rows:
        for kind, meas in shares.items():
            pred = p.by_device.get(kind)
            if not pred:
                continue
            diffs = {d: 100 * (pred.get(d, 0.0) - meas.get(d, 0.0)) for d in set(meas) | set(pred)}
            errs += [abs(v) for v in diffs.values()]
            if max(abs(v) for v in diffs.values()) < SHARE_SHOWN:
                continue  # (counted in the largest difference)
            out.append(
                f"- {cell.name}, {kind}: "
                + ", ".join(
                    f"{d} {100 * meas.get(d, 0):.0f} % measured, {100 * pred.get(d, 0):.0f} % "
                    f"predicted ({diffs[d]:+.0f} points)"
                    for d in sorted(diffs)
                )
            )
    if not errs:
        return []
    return (
        [
            "",
            "Where the time goes: each device's own time and the copies' (over RPC: the "
            "network's, data moving while no device computed), as shares of their sum; the "
            f"cells and kinds off by {SHARE_SHOWN} points or more:",
        ]
        + (out or ["- none"])
        + [f"Largest difference {max(errs):.0f} points (target: within 10 points)."]
    )


def cell_columns(iv: Any, meas: float | None, e: float | None) -> list[str]:
    """A kind's measured, predicted (interval) and error columns; a measured value outside its
    interval is marked (!)."""
    out = "" if inside(iv, meas) in (True, None) else " (!)"
    return [
        f"{meas:.1f}" if meas else "-",
        f"{iv.value:.1f} ({iv.low:.1f}-{iv.high:.1f}){out}" if iv else "not covered",
        f"{e:+.1f} %" if e is not None else "-",
    ]


def pct(pred: float | None, meas: float | None) -> float | None:
    if pred is None or not meas:
        return None
    return 100.0 * (pred - meas) / meas


# --- the thread and depth grids: settings no other cell of the grid tunes to ---

# the prompts of the thread grid, and the short prompt the depth grid's logs run (tokens)
THREAD_PROMPTS = (8, 48, 200)
DEPTHS = (512, 1024, 2048, 4096)
SHORT = 9
N_GEN = 32
# the times a run at a depth computes its short prompt (one step each: one run's single step
# can be a spike the cell's median of three runs still carries)
DEPTH_PROMPTS = 3
# seconds a run at a depth rests after filling it, before its session: this VM's host takes the
# second CPU away for seconds after a burst on both (after 15-17 s of filling 3,000 cells at 2
# threads, a KQ op at 3,072 cells ran at one thread's speed for the next 4-8 s in 4 of 5 trials,
# 910-980 us a layer against 550-580 before). The grid checks the prediction of the machine, not
# of its host's throttling after a burst, which no short log shows. The prompt is then computed
# once untimed (llama-bench's warm-up run): the first compute after the rest took 1.1-1.3x the
# next ones (113.8 / 86.1, 111.4 / 107.3, 96.0 / 90.1 ms at 1,024 cells; without the rest 78-80).
FILL_REST_S = 10
# the weight types whose matmul `instr peaks` measures for the grids: their models' (Q4_1 and its
# Q8_0 output, F16, F32)
PEAK_TYPES = ("f32", "f16", "q4_1", "q8_0")
# the second model: a llama of other shapes than SmolLM2's (12 layers, 768 wide, 12 heads of
# which 4 for K and V, F16 weights), written with gguf as tests/tiny_gguf.py writes its models
SECOND = {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_head_kv": 4, "n_ff": 2048}


def second_model(folder: Path) -> Path:
    """The grids' second model, written into ``folder`` on first use."""
    from helpers.tiny_gguf import write_tiny_model

    path = folder / "wide-f16.gguf"
    if not path.is_file():
        write_tiny_model(
            path.with_suffix(".partial"), dtype="f16", n_ctx_train=8192, seed=7, **SECOND
        )
        path.with_suffix(".partial").rename(path)
    return path


HELD: list[Any] = []


def hold(path: Path) -> None:
    """Keep a model's pages in memory for the bench (mlock of a mapping of the file, whose page
    cache llama.cpp's own mapping shares): a machine that pages out what is idle for seconds
    otherwise reads the weights from disk again in a run's first step."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    f = open(path, "rb")  # noqa: SIM115 (kept open while mapped)
    size = path.stat().st_size
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
    if addr in (None, ctypes.c_void_p(-1).value) or libc.mlock(
        ctypes.c_void_p(addr), ctypes.c_size_t(size)
    ):
        print(
            f"  could not lock {path.name} in memory (errno {ctypes.get_errno()})", file=sys.stderr
        )
    HELD.append((f, addr, size))


def raise_priority() -> str:
    """Run the bench ahead of the machine's other work where allowed: its own session (and so
    its own scheduling group) at nice -20. What it did, in words."""
    if os.environ.get("LLAMACPP_BENCH_SESSION") != "1":
        os.environ["LLAMACPP_BENCH_SESSION"] = "1"
        try:
            os.execvp("setsid", ["setsid", "-w", sys.executable, *sys.argv])
        except OSError:
            pass
    try:
        Path("/proc/self/autogroup").write_text("-20")
        os.nice(-20)
        return "the bench at nice -20 in a scheduling group of its own"
    except OSError as exc:
        return f"the bench at its own priority (raising it failed: {exc})"


def measure_peaks(folder: Path, counts: tuple[int, ...]) -> Path:
    """This machine's peaks at each thread count (bandwidth, the cost of starting the threads, the
    matmul throughput of the grids' weight types), the counts taking turns, saved in ``folder``'s
    cache for the predictions: what `instr peaks --thread-counts 1,2` measures."""
    from llamacpp_instr.converters.session import machine_peaks
    from llamacpp_instr.running import peak_probe

    cache = folder / "cache"
    plan = peak_probe.Plan(n_threads=counts[0], types=PEAK_TYPES)
    for p in peak_probe.measure_counts(counts, plan):
        n = p.n_threads
        machine_peaks.save(p, cache)
        cpu = p.device("CPU")
        print(
            f"peaks at {n} thread(s): {cpu.bandwidth_gbs:.1f} GB/s, a graph started on the threads "
            f"{cpu.sync_ns or 0:.0f} ns, matmul GFLOP/s "
            + ", ".join(f"{t} {v:.0f}" for t, v in sorted(cpu.matmul_gflops.items())),
            file=sys.stderr,
        )
    return cache


def thread_cells(models: dict[str, Path]) -> list[Cell]:
    return [Cell(m, t, n, 512) for m in models for n in THREAD_PROMPTS for t in (1, 2)]


def measured_median(logs: list[Path]) -> tuple[dict[str, float | None], dict[str, Path]]:
    """Per kind the median over a cell's runs of what each measured, and the run whose figure
    of that kind is the median (the log that kind's predictions are made from: a short prompt
    is one step, and one run's step can be a spike that the median of the cell's runs is not)."""
    from llamacpp_instr.deciding.prediction.predict import load_session, measured

    got = [measured(load_session(p)) for p in logs]
    out: dict[str, float | None] = {}
    src: dict[str, Path] = {}
    for kind in ("prompt", "gen"):
        ran = sorted((v, i) for i, g in enumerate(got) if (v := g[kind]))
        out[kind] = statistics.median(v for v, _ in ran) if ran else None
        src[kind] = logs[ran[len(ran) // 2][1]] if ran else logs[0]
    return out, src


def predicted_from(price: Callable[[Path], Any], src: dict[str, Path]) -> Any:
    """One prediction of both kinds, each kind's made from its own source log (``price``: a
    log's prediction)."""
    p = price(src["gen"])
    if src["prompt"] != src["gen"]:
        p = replace(p, prompt=price(src["prompt"]).prompt)
    return p


def run_reps(
    args: argparse.Namespace, cells: list[Cell], run: Any, where: Path
) -> dict[Cell, list[Path]]:
    """--reps runs of each cell, the cells taking turns (a busy spell falls on all alike), a run
    whose steps spread like a busy machine's run again (--retry-busy); logs kept in ``where``
    are reused."""
    out: dict[Cell, list[Path]] = {c: [] for c in cells}
    for rep in range(args.reps):
        for cell in cells:
            log = where / cell.file_name.replace(".log", f".{rep}.log")
            if not log.exists():
                print(f"running {cell.name} ({rep + 1}/{args.reps}) ...", file=sys.stderr)
                for retry in range(args.retry_busy + 1):
                    log.unlink(missing_ok=True)
                    run(cell, log)
                    if not busy(log):
                        break
                    print(f"  a busy machine's steps (try {retry + 1})", file=sys.stderr)
            out[cell].append(log)
    return out


def thread_grid(args: argparse.Namespace, where: Path, models: dict[str, Path]) -> list[str]:
    """Each cell from the one log of the same model and prompt at the other thread count (a
    user's single log), with this machine's peaks at both counts."""
    from llamacpp_instr.deciding.prediction import predict

    cache = measure_peaks(where, (1, 2))
    cells = thread_cells(models)
    runs = run_reps(args, cells, lambda c, log: run_cell(c, models[c.quant], N_GEN, log), where)
    meas = {c: measured_median(runs[c]) for c in cells}
    rows = []
    for cell in cells:
        src = next(
            c
            for c in cells
            if (c.quant, c.depth) == (cell.quant, cell.depth) and c.threads != cell.threads
        )

        def price(log: Path, cell: Cell = cell) -> Any:
            sf_src = predict.load_session(log)
            target = replace(
                predict.default_target(sf_src, models[cell.quant]), threads=cell.threads
            )
            model = predict.fit([sf_src], peaks_dir=cache, machine=MACHINE)
            return predict.price(target, model, [sf_src], [], MACHINE, peaks_dir=cache)

        rows.append((cell, predicted_from(price, meas[src][1]), meas[cell][0], {}))
    return grid_report(rows, "threads", lambda c: f"{'2 -> 1' if c.threads == 1 else '1 -> 2'}") + [
        busy_line(runs),
        spread_line(runs),
    ]


def depth_cells(models: dict[str, Path]) -> list[tuple[str, bool, int]]:
    return [(m, fa, d) for m in models for fa in (False, True) for d in (0, *DEPTHS)]


DEPTH_RUN = """
import sys
import time
sys.path.insert(0, {root!r})
import llama_cpp
from llamacpp_instr.running import api
llm = llama_cpp.Llama({model!r}, n_ctx={n_ctx}, n_batch=512, n_ubatch=512, n_threads={threads},
    n_threads_batch={threads}, flash_attn={fa}, verbose=False)
toks = llm.tokenize({text!r}.encode(), add_bos=True)
fill, prompt = toks[:{depth}], toks[{depth}:{depth} + {short}]
if fill:
    llm.eval(fill)  # the depth, before the session: llama-bench -d fills it untimed
    time.sleep({rest})
    llm.eval(prompt)  # the warm-up (FILL_REST_S)
with api.session(llm, {out!r}, level="detailed"):
    for _ in range({prompts}):  # the prompt again at the same depth, as llama-bench -r repeats
        llm.n_tokens = len(fill)  # (eval drops the cells from n_tokens on)
        llm.eval(prompt)
    for _ in range({gen}):
        llm.eval([prompt[-1]])
llm.close()
"""


def run_depth_cell(model: Path, fa: bool, depth: int, threads: int, out: Path) -> None:
    """A run at ``depth``: the cells filled before the session, then a short prompt and
    generation in it (a process of its own: one context's buffers at a time)."""
    import subprocess

    from llamacpp_instr.running import runner

    # every run of the grid with the context of the deepest (a KV cache laid out alike: without
    # flash attention V is stored transposed, its rows as long as the context)
    n_ctx = -(-(max(DEPTHS) + SHORT + N_GEN + 64) // KV_PAD) * KV_PAD
    if depth == 0:  # the source: instr run's log of a short prompt
        cfg = runner.RunConfig(
            model=model, prompt=prompt_of(model, SHORT), n_predict=N_GEN, threads=threads,
            n_ctx=n_ctx, n_batch=512, n_ubatch=512, level="detailed", out=out, ignore_eos=True,
            flash_attn=fa,
        )  # fmt: skip
        runner.run(cfg)
        return
    code = DEPTH_RUN.format(
        root=str(ROOT), model=str(model), n_ctx=n_ctx, threads=threads, fa=fa,
        text=prompt_of(model, depth + SHORT + 64), depth=depth, short=SHORT, out=str(out),
        gen=N_GEN, prompts=DEPTH_PROMPTS, rest=FILL_REST_S,
    )  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True, timeout=1800)


def depth_grid(args: argparse.Namespace, where: Path, models: dict[str, Path]) -> list[str]:
    """Each depth from the log of a short prompt (depth 0) of the same model and attention."""
    from llamacpp_instr.deciding.prediction import predict

    cells = {Cell(m, 2, d, 512, ngl=int(fa)): (m, fa, d) for m, fa, d in depth_cells(models)}

    def run(cell: Cell, log: Path) -> None:
        m, fa, d = cells[cell]
        run_depth_cell(models[m], fa, d, cell.threads, log)

    runs = run_reps(args, list(cells), run, where)
    meas = {c: measured_median(runs[c]) for c in cells}
    rows = []
    for cell, (m, fa, d) in cells.items():
        if d == 0:
            continue
        src = next(c for c, v in cells.items() if v == (m, fa, 0))

        def price(log: Path, m: str = m, d: int = d) -> Any:
            sf_src = predict.load_session(log)
            target = replace(predict.default_target(sf_src, models[m]), depth=d)
            return predict.price(
                target, predict.fit([sf_src], machine=MACHINE), [sf_src], [], MACHINE
            )

        rows.append((cell, predicted_from(price, meas[src][1]), meas[cell][0], {}))
    return grid_report(rows, "depth", lambda c: f"{'FA on' if c.ngl else 'FA off'}") + [
        busy_line(runs),
        spread_line(runs),
    ]


def grid_report(rows: list[Any], what: str, group: Any) -> list[str]:
    """A grid's table (measured, predicted with its interval, error per kind), its errors
    against the targets (threads: median 10 %, largest 20 %; depth: median 15 %) and its
    intervals' coverage and width."""
    lines = [
        "| cell | prompt tok/s measured | predicted (interval) | error | gen tok/s measured | predicted (interval) | error |",
        "|---|---|---|---|---|---|---|",
    ]
    errs: list[float] = []
    by: dict[tuple[str, str], list[float]] = {}
    for cell, p, m, _s in rows:
        size = f"p{cell.depth}" if what == "threads" else f"d{cell.depth}"
        cols = [f"{cell.quant} t{cell.threads} {size} ({group(cell)})"]
        for kind, iv in (("prompt", p.prompt), ("gen", p.gen)):
            e = pct(iv.value if iv else None, m[kind])
            if e is not None:
                errs.append(abs(e))
                by.setdefault((group(cell), kind), []).append(abs(e))
            cols += cell_columns(iv, m[kind], e)
        lines.append("| " + " | ".join(cols) + " |")
    target = (
        "median at most 10 %, largest at most 20 %" if what == "threads" else "median at most 15 %"
    )
    lines.append("")
    if errs:
        lines.append(
            f"{what}: median absolute error {statistics.median(errs):.1f} %, largest {max(errs):.1f} % "
            f"({len(errs)} predictions; target: {target}); "
            + "; ".join(
                f"{g} {k} {statistics.median(v):.1f} % (largest {max(v):.1f} %)"
                for (g, k), v in sorted(by.items())
            )
            + "."
        )
    else:
        lines.append(f"{what}: no cell predicted.")
    lines.append(coverage_line(rows))
    lines.append(log_error_line(rows, what))
    return lines


def log_error_line(rows: list[Any], what: str) -> str:
    """The 95th percentile of |ln(measured / predicted)| over a grid's predictions (``what``:
    "threads", "depth", else one of the placement grids): what the interval of a prediction no
    held-out log makes is set to (intervals.py), against it."""
    import math

    from llamacpp_instr.deciding.prediction import intervals

    logs = [
        abs(math.log(m[kind] / iv.value))
        for _c, p, m, _s in rows
        for kind, iv in (("prompt", p.prompt), ("gen", p.gen))
        if iv is not None and m[kind]
    ]
    if not logs:
        return ""
    name = {"threads": "BENCH_THREADS_HALF", "depth": "BENCH_DEPTH_HALF"}.get(what, "BENCH_HALF")
    now = getattr(intervals, name)
    return (
        f"|ln(measured / predicted)|: 95th percentile {float(np.percentile(logs, 95)):.3f} over "
        f"the {len(logs)} predictions (intervals.{name}, the half-width of an interval no "
        f"held-out log makes, is {now})."
    )


def spread_line(runs: dict[Cell, list[Path]]) -> str:
    """How far a cell's own runs are from each other (their range over their median, per kind):
    the noise the grid's errors include, one run's prompt being a single step."""
    from llamacpp_instr.deciding.prediction.predict import load_session, measured

    spreads: dict[str, list[tuple[float, str]]] = {"prompt": [], "gen": []}
    for cell, logs in runs.items():
        if len(logs) < 2:
            continue
        got = [measured(load_session(p)) for p in logs]
        for kind, out in spreads.items():
            vals = [g[kind] for g in got if g[kind]]
            if len(vals) >= 2:
                out.append(((max(vals) - min(vals)) / statistics.median(vals), cell.file_name))
    parts = [
        f"{kind} median {100 * statistics.median(v for v, _ in got):.0f} %, largest "
        f"{100 * max(got)[0]:.0f} % ({max(got)[1].removesuffix('.log')})"
        for kind, got in spreads.items()
        if got
    ]
    return (
        "A cell's runs spread (their range over their median): " + "; ".join(parts) + "."
        if parts
        else ""
    )


def busy_line(runs: dict[Cell, list[Path]]) -> str:
    """How many of the grid's runs spread like a busy machine's, and the load average now."""
    every = [p for logs in runs.values() for p in logs]
    flagged = sum(busy(p) for p in every)
    return (
        f"{flagged} of the grid's {len(every)} runs spread like a busy machine's; load average "
        f"{os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} cores."
    )


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gen", type=int, default=32, help="tokens generated per cell")
    ap.add_argument("--quick", action="store_true", help="the Q4_1, 2-thread cells only")
    ap.add_argument(
        "--vulkan",
        action="store_true",
        help="the placement grid on lavapipe (-ngl 0, 15, 30; LLAMA_CPP_LIB_PATH at a Vulkan "
        "build, GGML_VK_VISIBLE_DEVICES=0)",
    )
    ap.add_argument(
        "--rpc",
        action="store_true",
        help="two RPC servers on hosts of their own (network namespaces, needs root) at two link "
        "rates, each predicted from the other with the held-out link as --rpc-rate/--rpc-rtt",
    )
    ap.add_argument(
        "--threads-grid",
        action="store_true",
        help="two models, three prompts, 1 and 2 threads: each cell from the other count's log "
        "alone, with this machine's peaks at both",
    )
    ap.add_argument(
        "--depth-grid",
        action="store_true",
        help="two models, flash attention off and on, depths 512 to 4096: each from the log of a "
        "short prompt",
    )
    ap.add_argument(
        "--priority",
        action="store_true",
        help="run at nice -20 in a scheduling group of its own (a machine shared with other "
        "work; needs root or CAP_SYS_NICE)",
    )
    ap.add_argument("--keep", type=Path, default=None, help="keep the cells' logs here")
    ap.add_argument(
        "--reps", type=int, default=2, help="runs per cell; the fastest is kept (llama-bench's -r)"
    )
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="S",
        help="before each run, wait up to S seconds for the CPUs to be 80 %% idle over 3 s (a "
        "machine shared with other work)",
    )
    ap.add_argument(
        "--retry-busy",
        type=int,
        default=0,
        metavar="N",
        help="run a cell again, up to N times, while its steps spread like a busy machine's "
        "(instr summary's verdict: contention.py)",
    )
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    return args


def run_grid(
    args: argparse.Namespace, grid: list[Cell], files: dict[str, Path], where: Path
) -> tuple[dict[Cell, Path], bool, float]:
    """Each cell's log in ``where`` (a log kept there from an earlier run is reused): the fastest
    of --reps runs, a run whose steps spread like a busy machine's run again (--retry-busy);
    whether any cell ran, and the seconds the runs took."""
    logs: dict[Cell, Path] = {}
    ran_any = False
    t0 = time.monotonic()
    # the fastest of --reps runs: on 2 cores another process's burst slows a step of ggml's
    # spinning threads tens of times, which is not the setting's speed. The cells' runs take
    # turns, so that a busy spell of the machine falls on every cell alike
    attempts: dict[Cell, list[Path]] = {}
    for rep in range(args.reps):
        for cell in grid:
            log = where / cell.file_name
            if log.exists():
                continue
            ran_any = True
            print(f"running {cell.name} ({rep + 1}/{args.reps}) ...", file=sys.stderr)
            attempt = log.with_suffix(f".{rep}.log")
            for retry in range(args.retry_busy + 1):
                waited = wait_idle(args.wait_idle)
                if waited:
                    print(f"  waited {waited:.0f} s for idle CPUs", file=sys.stderr)
                attempt.unlink(missing_ok=True)
                run_cell(cell, files[cell.quant], args.gen, attempt)
                if not busy(attempt):
                    break
                print(f"  a busy machine's steps (try {retry + 1})", file=sys.stderr)
            attempts.setdefault(cell, []).append(attempt)
    for cell in grid:
        log = where / cell.file_name
        if not log.exists():
            tried = attempts[cell]
            min(tried, key=lambda a: slowness(a, tried)).rename(log)
        logs[cell] = log
    run_s = time.monotonic() - t0
    return logs, ran_any, run_s


def on_vulkan() -> None:
    """--vulkan: this process run again under the Vulkan build on lavapipe (``lavapipe_env``),
    where it is not already; without that build, one line and exit status 1 (the CPU build
    would run every cell on the CPU)."""
    from llamacpp_instr.native import build
    from llamacpp_instr.running.vulkan_env import lavapipe_env

    lib = build.vulkan_lib_dir(lambda s: print(s, file=sys.stderr), build_it=False)
    if lib is None:
        sys.exit("--vulkan needs the Vulkan build: run `instr build --vulkan --no-install`")
    if os.environ.get("LLAMA_CPP_LIB_PATH") != str(lib):
        os.execve(sys.executable, [sys.executable, *sys.argv], lavapipe_env(lib))


def main() -> None:
    args = parse_args()
    if args.vulkan:
        on_vulkan()

    from llama_cpp import _logger

    from llamacpp_instr.deciding.prediction import predict
    from llamacpp_instr.native import models
    from llamacpp_instr.running.quant.sweep import quantized

    _logger.set_verbose(False)
    said = raise_priority() if args.priority else "the bench at its own priority"
    if args.threads_grid or args.depth_grid:
        new_grids(args, said)
        return
    load_at_start = os.getloadavg()
    grid = VULKAN if args.vulkan else RPC if args.rpc else QUICK if args.quick else GRID
    base = models.default_model()
    files = {"q4_1": base}
    for q in sorted({c.quant for c in grid} - {"q4_1"}):
        files[q] = quantized(base, q, 0, lambda s: print(s, file=sys.stderr))
    for f in files.values():
        hold(f)
    tmp = tempfile.TemporaryDirectory()
    where = args.keep or Path(tmp.name)
    where.mkdir(parents=True, exist_ok=True)
    logs, ran_any, run_s = run_grid(args, grid, files, where)
    sessions = {c: predict.load_session(p) for c, p in logs.items()}
    counts = tuple(sorted({c.threads for c in grid}))
    peaks = measure_peaks(where, counts) if len(counts) > 1 else None

    rows = [
        predict_cell(cell, [c for c in grid if c != cell], sessions, files[cell.quant], peaks)
        for cell in grid
    ]
    thread_rows: list[Any] = []
    if not (args.vulkan or args.rpc or args.quick):
        # each cell from the logs of the other thread count only
        thread_rows = [
            predict_cell(cell, [c for c in grid if c.threads != cell.threads], sessions,
                         files[cell.quant], peaks)
            for cell in grid
        ]  # fmt: skip

    # speed: predict from one detailed log of 100 generation steps
    speed_s = float("nan")
    if not (args.vulkan or args.rpc):
        with tempfile.TemporaryDirectory() as d:
            long_log = Path(d) / "long.log"
            run_cell(grid[0], base, 100, long_log)
            t = time.monotonic()
            predict.predict([long_log], MACHINE)
            speed_s = time.monotonic() - t

    lines = report(rows, thread_rows)
    if not (args.vulkan or args.rpc):
        lines.append(
            f"`predict` from one detailed log of 100 generation steps: {speed_s:.2f} s (target: "
            "under 5 s)."
        )
    ran = f"took {run_s:.0f} s" if ran_any else "were reused from --keep"
    load = os.getloadavg()
    flagged = [c.name for c in grid if busy(logs[c])]
    lines.append(
        f"The grid's {len(grid)} cells' runs {ran}, with {said}, the models held in memory; load "
        f"average {load_at_start[0]:.1f} at the "
        f"start, {load[0]:.1f} at the end, on {os.cpu_count()} cores; "
        + (
            f"{len(flagged)} of the logs kept spread like a busy machine's ({', '.join(flagged)})."
            if flagged
            else "no log kept spreads like a busy machine's."
        )
    )
    text = "\n".join(lines)
    print(text)
    if args.write_docs:
        write_docs(
            "predict-vulkan" if args.vulkan else "predict-rpc" if args.rpc else "predict", text
        )


def write_docs(tag: str, text: str) -> None:
    """``text`` between docs/accuracy.md's markers of ``tag``."""
    doc = Path(__file__).resolve().parent.parent / "docs" / "accuracy.md"
    body = doc.read_text()
    start, end = f"<!-- bench:{tag} -->", f"<!-- /bench:{tag} -->"
    i, j = body.index(start) + len(start), body.index(end)
    doc.write_text(body[:i] + "\n" + text + "\n" + body[j:])


def new_grids(args: argparse.Namespace, said: str) -> None:
    """--threads-grid and --depth-grid: their tables, each to docs/accuracy.md with
    --write-docs (``said``: the priority the bench runs at)."""
    from llamacpp_instr.native import models

    tmp = tempfile.TemporaryDirectory()
    where = args.keep or Path(tmp.name)
    where.mkdir(parents=True, exist_ok=True)
    files = {"smollm2": models.default_model(), "wide": second_model(where)}
    for f in files.values():
        hold(f)
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    for flag, tag, grid in (
        (args.threads_grid, "predict-threads", thread_grid),
        (args.depth_grid, "predict-depth", depth_grid),
    ):
        if not flag:
            continue
        lines = grid(args, where, files)
        lines.append(
            f"Measured with {said}, the models held in memory; {args.reps} runs a cell, the "
            f"cells taking turns, each cell's median; load average {load:.1f} at the start; the "
            f"grids took {time.monotonic() - t0:.0f} s so far."
        )
        text = "\n".join(lines)
        print(text)
        if args.write_docs:
            write_docs(tag, text)


if __name__ == "__main__":
    main()
