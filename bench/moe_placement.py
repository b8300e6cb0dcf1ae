"""Expert placements predicted against real runs, leave one out, on lavapipe.

The small MoE test model (tests/helpers/moe_gguf.py: SmolLM2's first 4 layers, 8 distinct experts, top-2)
with every layer on Vulkan0 and the experts of none, half and all of the layers on the CPU
(``--n-cpu-moe 0, 2, 4``), each a real detailed run; each is predicted from the other two's logs
only (``predict``, as ``instr plan --experts`` prices a placement: the graphs built by llama.cpp with
its rules) and compared with what it measured, prompt and generation tokens/s (tokens over the
steps' time, ``predict.measured``). Then ``plan --experts`` ranks the placements from all three
logs, beside the order they measured.

    GGML_VK_VISIBLE_DEVICES=0 LLAMA_CPP_LIB_PATH=<instr build --vulkan --no-install's> \\
        python bench/moe_placement.py [--reps 5] [--gen 16] [--keep DIR] [--write-docs]

The cells run in ``--reps`` rounds, taking turns, and each round's cells are predicted from that
round's other two (lavapipe shares the machine's 2 cores with the CPU backend and whatever else
runs: a round's runs meet the same machine); the CPU backend on 1 thread by default (at 2, its
workers and lavapipe's contend for the cores). Target: generation median absolute error at most
15 % over every prediction.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from overhead import write_section  # noqa: E402
from predict import MACHINE, pct  # noqa: E402

N_LAYER = 4
CELLS = (0, N_LAYER // 2, N_LAYER)  # --n-cpu-moe: none, half, all
PROMPT = "The capital of France is a city of many bridges, and its river"


def model_path(where: Path) -> Path:
    from helpers.moe_gguf import write_moe_model

    from llamacpp_instr.native import models

    dest = where / "moe-small.gguf"
    if not dest.exists():
        write_moe_model(models.default_model(), dest, n_layer=N_LAYER, distinct=True)
    return dest


def run_cell(model: Path, n_cpu_moe: int, gen: int, threads: int, out: Path) -> None:
    from llamacpp_instr.running import offload, runner
    from llamacpp_instr.running.tensor_overrides import TensorOverrides

    cfg = runner.RunConfig(
        model=model,
        prompt=PROMPT,
        n_predict=gen,
        threads=threads,
        n_ctx=256,
        level="detailed",
        out=out,
        ignore_eos=True,
        offload=offload.Offload(gpu_layers=99),
        tensors=TensorOverrides.from_options(n_cpu_moe=n_cpu_moe or None),
    )
    runner.run(cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gen", type=int, default=16, help="tokens generated per run")
    ap.add_argument("--reps", type=int, default=5, help="rounds: runs per cell")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="the CPU backend's threads (1: its ops on the main thread, beside lavapipe's workers)",
    )
    ap.add_argument("--keep", type=Path, default=None, help="keep the model and logs here")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()

    from llama_cpp import _logger

    from llamacpp_instr.deciding import moe_plan
    from llamacpp_instr.deciding.prediction import predict
    from llamacpp_instr.running import devices, offload

    _logger.set_verbose(False)
    if not any(d.name.startswith("Vulkan") for d in devices.registry()):
        sys.exit("no Vulkan device: run with a Vulkan build (LLAMA_CPP_LIB_PATH) on lavapipe")
    tmp = tempfile.TemporaryDirectory()
    where = args.keep or Path(tmp.name)
    where.mkdir(parents=True, exist_ok=True)
    model = model_path(where)
    t0 = time.monotonic()
    logs: dict[tuple[int, int], Path] = {}
    ran = 0
    for rep in range(args.reps):
        for n in CELLS:
            log = where / f"ncmoe{n}.{rep}.log"
            if not log.exists():
                print(f"running --n-cpu-moe {n} ({rep + 1}/{args.reps}) ...", file=sys.stderr)
                run_cell(model, n, args.gen, args.threads, log)
                ran += 1
            logs[(rep, n)] = log
    run_s = time.monotonic() - t0
    sessions = {k: predict.load_session(p) for k, p in logs.items()}

    # each round's cells, each predicted from the same round's other two
    got: dict[int, dict[str, list[tuple[float, float, float]]]] = {n: {} for n in CELLS}
    for rep in range(args.reps):
        for n in CELLS:
            others = [sessions[(rep, o)] for o in CELLS if o != n]
            target = predict.default_target(sessions[(rep, n)], model)
            p = predict.price(target, predict.fit(others, machine=MACHINE), others, [], MACHINE)
            m = predict.measured(sessions[(rep, n)])
            for kind, iv in (("prompt", p.prompt), ("gen", p.gen)):
                meas = m[kind]
                e = pct(iv.value if iv and not p.not_covered else None, meas)
                if iv is not None and e is not None and meas:
                    got[n].setdefault(kind, []).append((meas, iv.value, e))

    lines = [
        "| --n-cpu-moe | prompt tok/s measured | predicted | error | gen tok/s measured "
        "| predicted | error |",
        "|---|---|---|---|---|---|---|",
    ]
    errs: dict[str, list[float]] = {"prompt": [], "gen": []}
    for n in CELLS:
        cols = [f"{n} ({'none' if n == 0 else 'all' if n == N_LAYER else 'half'})"]
        for kind in ("prompt", "gen"):
            rows = got[n].get(kind, [])
            errs[kind] += [abs(e) for *_, e in rows]
            if not rows:
                cols += ["-", "not covered", "-"]
                continue
            med = [statistics.median(x[i] for x in rows) for i in range(3)]
            cols += [f"{med[0]:.2f}", f"{med[1]:.2f}", f"{med[2]:+.1f} %"]
        lines.append("| " + " | ".join(cols) + " |")

    # plan's ranking from the last round's logs, beside the order the runs measured
    last = args.reps - 1
    all_logs = [logs[(last, n)] for n in CELLS]
    ss = [sessions[(last, n)] for n in CELLS]
    target = moe_plan.base_target(ss, model, offload.Offload(gpu_layers=99))
    planner = moe_plan.Planner(target, ss, [str(p) for p in all_logs], MACHINE)
    ranked = planner.candidates(256, MACHINE.free_memory())
    order = [c.placement.n_cpu_moe for c in ranked if c.placement.n_cpu_moe in CELLS]
    measured = sorted(CELLS, key=lambda n: -statistics.median(x[0] for x in got[n]["gen"]))

    def summary(kind: str) -> str:
        e = errs[kind]
        if not e:
            return f"{kind}: no cell predicted"
        return (
            f"{kind}: median absolute error {statistics.median(e):.1f} %, largest {max(e):.1f} % "
            f"({len(e)} predictions: {args.reps} rounds of {len(CELLS)} cells)"
        )

    lines += [
        "",
        summary("gen") + " (target: median at most 15 %).",
        summary("prompt") + ".",
        f"`plan --experts` ranks --n-cpu-moe {', '.join(map(str, order))} (of {len(ranked)} "
        f"placements, per-layer -ot ones included); the runs measured "
        f"{', '.join(map(str, measured))} fastest first (medians over the rounds).",
        f"Cells: the median over {args.reps} rounds, each round's cells run in turn and each "
        f"predicted from the same round's other two; {args.threads} CPU thread(s), "
        f"{args.gen} generated tokens; "
        + (f"{ran} runs took {run_s:.0f} s." if ran else "the runs were reused from --keep."),
    ]
    text = "\n".join(lines)
    print(text)
    if args.write_docs:
        write_section("moe_placement", text)


if __name__ == "__main__":
    main()
