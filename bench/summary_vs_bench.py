"""The summary's headline tokens/s against llama.cpp's own benchmark.

    python bench/summary_vs_bench.py [--model GGUF] [-n 32] [--rounds 3] [--threads 2]
                                     [--settings cpu,rpc] [--write-docs]

Per setting, round by round (interleaved, so that drift of the shared machine hits both alike):

- `instr run MODEL --prompt-file F -n N --ignore-eos -t T` (the default level, detailed), and the
  summary's figures of its log (`summary.overview`: prompt and generation tokens/s, each the
  steps' tokens over the steps' time, a step running until its outputs are ready);
- `llama-bench` (`instr build --tools`' build, no session) on the same model and setting: the
  prompt as one batch of the run's prompt tokens (`-p P -n 0`), and N generated tokens after a
  context of P (`-p 0 -n N -d P`), its own mean over `-r` repetitions after its warm-up.

Settings: `cpu` (no offload), `rpc` (every layer on one `ggml-rpc-server` on loopback, `-ngl 99`),
`vulkan` (every layer on Vulkan0: Mesa's lavapipe where there is no GPU, `-ngl 99`; the run on
`instr build --vulkan`'s libraries, llama-bench from `instr build --tools --vulkan`).
Both programs run at their own defaults, as a user runs them (batch, micro-batch, flash
attention: llama.cpp's `auto` in both), given the same thread count; the table says the flash
attention each had (what the run's log says it used; what llama-bench's JSON says was asked).
The run's prompt step is
its first decode (cold: no warm-up), the bench's is not. Prints per setting and test the median
tokens/s of each, the median of the per-round ratios (summary / llama-bench; target 0.85-1.15) and,
for reference, what the summary said when a step ended at `llama_decode`'s return
(`steps.llama_decode_ns`); `--write-docs` puts the table in docs/accuracy.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from helpers import netsim  # noqa: E402

from llamacpp_instr.converters import load_session  # noqa: E402
from llamacpp_instr.converters.reports.summary import overview  # noqa: E402
from llamacpp_instr.native import build, models, tools  # noqa: E402

PROMPT = (
    "The history of the city begins with a small settlement on the river, where traders met to "
    "exchange grain, salt and wool. Over the centuries the market grew into a town, the town into "
    "a city, and the city into the capital of a province whose roads, bridges and canals carried "
    "goods to every corner of the country. Today its old quarter still keeps the narrow streets, "
    "the stone houses and the great square where the market is held every week."
)
TARGET = (0.85, 1.15)
# the flash attention each program used, said in the table ("instr run on", "llama-bench auto")
FLASH_USED: set[str] = set()


def echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _env(vk_lib: Path | None = None, threads: int = 2) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_INSTR_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if vk_lib is not None:
        from llamacpp_instr.running.vulkan_env import lavapipe_env

        env = lavapipe_env(vk_lib, threads, env)
    return env


def instr_run(
    model: Path,
    prompt: Path,
    log: Path,
    args: argparse.Namespace,
    rpc: str | None,
    vk_lib: Path | None = None,
) -> dict[str, float]:
    offload = rpc is not None or vk_lib is not None
    cmd = [sys.executable, "-m", "llamacpp_instr.cli", "run", str(model), "--prompt-file", str(prompt),
           "-n", str(args.n), "--ignore-eos", "-t", str(args.threads), "-o", str(log),
           "-ngl", "99" if offload else "0"]  # fmt: skip
    if rpc:
        cmd += ["--rpc", rpc]
    env = _env(vk_lib, args.threads)
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"instr run failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    f = load_session(log)
    ov = overview(f)
    gen = f.steps[f.steps["kind"] == "gen"]
    return {
        "prompt_tokens": float(ov["prompt_tokens"]),
        "pp": float(ov["prompt_tok_s"]),
        "tg": float(ov["gen_tok_s"]),
        "tg_decode": float(gen["n_tokens"].sum() / (gen["llama_decode_ns"].sum() / 1e9)),
        "flash_attn": float(bool((f.info.context or {}).get("flash_attn"))),
    }


def llama_bench(
    exe: Path,
    model: Path,
    test: list[str],
    args: argparse.Namespace,
    rpc: str | None,
    vulkan: bool = False,
) -> float:
    offload = rpc is not None or vulkan
    cmd = [str(exe), "-m", str(model), *test, "-t", str(args.threads), "-ngl", "99" if offload else "0",
           "-r", str(args.r), "-o", "json"]  # fmt: skip
    if rpc:
        cmd += ["--rpc", rpc]
    env = _env()
    if vulkan:  # the static llama-bench needs no library path, only lavapipe's switches
        from llamacpp_instr.running.vulkan_env import lavapipe_env

        env = lavapipe_env(None, args.threads, env)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"llama-bench failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    rows = json.loads(r.stdout)
    # its JSON says llama_flash_attn_type as asked: -1 auto, 0 off, 1 on
    fa = {-1: "auto", 0: "off", 1: "on"}.get(int(rows[0].get("flash_attn", -1)), "?")
    FLASH_USED.add(f"llama-bench {fa}")
    return float(rows[0]["avg_ts"])


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("-n", type=int, default=32, help="generated tokens")
    ap.add_argument("-r", type=int, default=3, help="llama-bench repetitions per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--settings", default="cpu,rpc,vulkan", help="comma-separated: cpu, rpc, vulkan"
    )
    ap.add_argument(
        "--bin", type=Path, default=None, help="where llama-bench and ggml-rpc-server are "
        "(default: `instr build --tools`' folder, built if missing)"
    )  # fmt: skip
    ap.add_argument("--write-docs", action="store_true", help="update docs/accuracy.md")
    args = ap.parse_args()
    model = args.model or models.default_model()
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    bins = args.bin or tools.build_tools(echo, programs=("llama-bench", "ggml-rpc-server"))
    vk_bins = vk_lib = None
    if "vulkan" in settings:
        vk_bins = tools.build_tools(echo, build.VULKAN_CMAKE_ARGS, programs=("llama-bench",))
        vk_lib = build.vulkan_lib_dir(echo)
    got: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    args.load = [os.getloadavg()[0]]
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="summary-vs-bench-")))
        prompt = tmp / "prompt.txt"
        prompt.write_text(PROMPT)
        rpc_ep = None
        if "rpc" in settings:
            server = netsim.binary_server_command(bins / "ggml-rpc-server", args.threads)
            net = stack.enter_context(netsim.Network([(None, 0.0, server)], loopback=True))
            rpc_ep = net.endpoints[0]
        for k in range(args.rounds):
            for s in settings:
                ep = rpc_ep if s == "rpc" else None
                vk = s == "vulkan"
                run = instr_run(
                    model, prompt, tmp / f"{s}-{k}.log", args, ep, vk_lib if vk else None
                )
                p = int(run["prompt_tokens"])
                FLASH_USED.add(f"instr run {'on' if run['flash_attn'] else 'off'}")
                exe = (vk_bins if vk and vk_bins else bins) / "llama-bench"
                pp = llama_bench(exe, model, ["-p", str(p), "-n", "0"], args, ep, vk)
                tg_test = ["-p", "0", "-n", str(args.n), "-d", str(p)]
                tg = llama_bench(exe, model, tg_test, args, ep, vk)
                got.setdefault((s, f"pp{p}"), []).append((run["pp"], pp, run["pp"]))
                got.setdefault((s, f"tg{args.n}"), []).append((run["tg"], tg, run["tg_decode"]))
                echo(f"round {k + 1} {s}: pp{p} {run['pp']:.1f} vs {pp:.1f}; "
                     f"tg{args.n} {run['tg']:.1f} vs {tg:.1f} (to llama_decode's return: "
                     f"{run['tg_decode']:.1f})")  # fmt: skip
    args.load.append(os.getloadavg()[0])
    report = table(got, model, args)
    print(report)
    if args.write_docs:
        from overhead import write_section

        write_section("summary_vs_bench", report, script="bench/summary_vs_bench.py")


def table(
    got: dict[tuple[str, str], list[tuple[float, float, float]]], model: Path, args: Any
) -> str:
    lines = [
        f"{model.name}; {args.rounds} interleaved rounds; {args.threads} threads; llama-bench "
        f"-r {args.r}; each at its own defaults (flash attention used: "
        f"{', '.join(sorted(FLASH_USED))}); "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores. rpc: every layer on "
        "one ggml-rpc-server on loopback; vulkan: every layer on Vulkan0 (Mesa's lavapipe). The summary's figures are of `instr run`'s log at its "
        "default level (detailed); the generation test runs after a context of the prompt's tokens "
        f"(`-d`) in both. Load average (1 min) at the start and the end: {args.load[0]:.1f}, "
        f"{args.load[1]:.1f}.",
        "",
        "| setting | test | summary tok/s | llama-bench tok/s | summary / llama-bench (median of "
        "rounds) | within 15 % | to llama_decode's return (before) |",
        "|---|---|---|---|---|---|---|",
    ]
    for (s, test), rows in got.items():
        ratios = [a / b for a, b, _ in rows]
        ratio = statistics.median(ratios)
        before = statistics.median(c / b for _, b, c in rows)
        ok = "yes" if TARGET[0] <= ratio <= TARGET[1] else "no"
        lines.append(
            f"| {s} | {test} | {statistics.median(a for a, _, _ in rows):.1f} | "
            f"{statistics.median(b for _, b, _ in rows):.1f} | {ratio:.3f}x "
            f"({min(ratios):.3f}-{max(ratios):.3f}) | {ok} | {before:.3f}x |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
