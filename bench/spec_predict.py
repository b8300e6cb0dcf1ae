"""`instr predict --spec-draft-n-max` checked leave-one-out on real llama-server runs.

    python bench/spec_predict.py [--model GGUF] [--threads 1] [--requests 4] [--n-predict 48]
                                 [--rounds 3] [--write-docs]

Three kinds of drafting, each at three draft lengths (nine runs of the patched llama-server of
`instr build --tools` a round, under `instr exec --level minimal`, in a shuffled order each
round): a draft made of
the model's first 6 layers and one of its first 15 (`tests/helpers/draft_gguf.py`, `-md` with
`--spec-type draft-simple`), at `--spec-draft-n-max` 2, 4 and 8; and n-gram drafting
(`--spec-type ngram-simple`, lookups of 2 tokens) at `--spec-ngram-simple-size-m` 2, 4 and 8.
Each run answers the same requests (greedy, `ignore_eos`), one at a time: two of prose, two of
text that repeats. Each run is then predicted from its round's runs of the
other two lengths of its kind alone (`spec_predict.run`: their acceptance by draft position and
their batch costs), and the prediction set against the server's own generation speed: the mean
of its responses' `timings.predicted_per_second`. Target: median error at most 15 %. (Predicted
from every round's runs instead, the machine's drift between rounds counts too: also given.)
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
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from llamacpp_instr.deciding.prediction import spec_predict  # noqa: E402
from llamacpp_instr.native import models, tools  # noqa: E402

LENGTHS = (2, 4, 8)
# prose, and text that repeats (which an n-gram draft can only draft from: it copies what followed
# the last few tokens where they were seen before)
PROMPTS = [
    "The history of the river mill begins",
    "Repeat after me five times: the river ran past the old mill. The river ran past the old "
    "mill. The river ran past the old mill.",
    "Once upon a time, in a village by the sea,",
    "Count with me: one, two, three, four, one, two, three, four, one, two, three, four,",
]
TARGET = 0.15


def echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def kinds(model: Path, folder: Path) -> dict[str, tuple[str, list[str]]]:
    """Each kind of drafting: its name, and the server's options at length ``{n}``."""
    from helpers.draft_gguf import cached_draft

    out: dict[str, tuple[str, list[str]]] = {}
    for layers in (6, 15):
        draft = cached_draft(model, folder, layers)
        out[f"draft{layers}"] = (
            f"a draft of the first {layers} layers",
            ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", "{n}"],
        )
    out["ngram"] = (
        "n-gram drafting (ngram-simple)",
        ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2"]
        + ["--spec-ngram-simple-size-m", "{n}"],
    )
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def complete(port: int, prompt: str, n_predict: int) -> dict[str, Any]:
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return dict(json.loads(r.read()))


def serve(log: Path, model: Path, extra: list[str], args: argparse.Namespace) -> list[float]:
    """One run: the responses' predicted_per_second."""
    port = free_port()
    cmd = [sys.executable, "-m", "llamacpp_instr.cli", "exec", "-o", str(log), "--level"]
    cmd += ["minimal", "llama-server", "-m", str(model), "--host", "127.0.0.1", "--port"]
    cmd += [str(port), "--parallel", "1", "-c", "2048", "-t", str(args.threads), "--no-webui"]
    cmd += ["--cache-ram", "0", *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_INSTR_")}
    err = open(log.with_suffix(".stderr"), "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"llama-server exited: see {err.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.3)
            if time.monotonic() - t0 > 180:
                raise SystemExit("llama-server did not start")
        speeds = []
        for p in PROMPTS[: args.requests]:
            t = complete(port, p, args.n_predict)["timings"]
            speeds.append(float(t["predicted_per_second"]))
        time.sleep(1.0)  # (the last request's record)
        return speeds
    finally:
        proc.terminate()
        proc.wait(60)
        err.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--n-predict", type=int, default=48)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--logs", type=Path, default=None, help="keep the runs' logs here")
    ap.add_argument(
        "--reuse", action="store_true", help="predict from the runs kept in --logs, run nothing"
    )
    ap.add_argument("--write-docs", action="store_true", help="update docs/accuracy.md")
    args = ap.parse_args()
    model = args.model or models.default_model()
    tools.build_tools(echo, programs=("llama-server",))
    runs: dict[tuple[str, int], list[tuple[Path, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="spec-predict-") as tmp:
        folder = args.logs or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        ks = kinds(model, folder)
        rng = random.Random(args.seed)
        kept = folder / "speeds.json"
        if args.reuse:  # the runs of an earlier call, kept with --logs
            for key, speeds in json.loads(kept.read_text()).items():
                k, n = key.rsplit("-", 1)
                runs[(k, int(n))] = [
                    (folder / f"{k}-{n}-r{r}.log", v) for r, v in enumerate(speeds)
                ]
            args.rounds = len(next(iter(runs.values())))
        for r in range(0 if args.reuse else args.rounds):
            order = [(k, n) for k in ks for n in LENGTHS]
            rng.shuffle(order)
            for k, n in order:
                log = folder / f"{k}-{n}-r{r}.log"
                log.unlink(missing_ok=True)
                extra = [a.replace("{n}", str(n)) for a in ks[k][1]]
                speed = statistics.mean(serve(log, model, extra, args))
                runs.setdefault((k, n), []).append((log, speed))
                echo(f"  round {r + 1} {k} n-max {n}: {speed:.1f} tokens/s (the server's)")
        kept.write_text(json.dumps({f"{k}-{n}": [v for _, v in x] for (k, n), x in runs.items()}))
        rows, errors, pooled = [], [], []
        for k in ks:
            cells = []
            for n in LENGTHS:
                # each round's run from the same round's runs of the other lengths (the machine
                # at the same time), and from every round's (its drift between rounds included)
                preds, errs = [], []
                for r, (_, speed) in enumerate(runs[(k, n)]):
                    others = [runs[(k, m)][r][0] for m in LENGTHS if m != n]
                    doc = spec_predict.run(others, n, args.n_predict - 1)
                    preds.append(doc["asked"]["gen_tokens_per_s"])
                    errs.append(preds[-1] / speed - 1)
                errors += [abs(e) for e in errs]
                every = [log for m in LENGTHS if m != n for log, _ in runs[(k, m)]]
                whole = spec_predict.run(every, n, args.n_predict - 1)
                meas = statistics.median(s for _, s in runs[(k, n)])
                pooled.append(abs(whole["asked"]["gen_tokens_per_s"] / meas - 1))
                x = "*" if whole["asked"]["extrapolated"] else ""
                cells.append(
                    f"{meas:.1f} / {statistics.median(preds):.1f}{x} "
                    f"({' '.join(f'{e * 100:+.0f}' for e in errs)} %)"
                )
            rows.append(f"| {ks[k][0]} | " + " | ".join(cells) + f" | {whole['best_n_max']} |")
    med = statistics.median(errors)
    text = "\n".join(
        [
            "| drafting | "
            + " | ".join(
                f"n-max {n}: measured / predicted tok/s (error each round)" for n in LENGTHS
            )
            + " | fastest n-max (predicted) |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"{model.name}, llama-server `--parallel 1 -t {args.threads}`, {args.requests} "
            f"requests of {args.n_predict} tokens a run (greedy), {args.rounds} rounds; "
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; measured: the "
            "server's (median of the rounds), * extrapolated. Median error "
            f"{med * 100:.1f} % over {len(errors)} runs, each predicted from its round's other two "
            f"lengths (target at most {TARGET * 100:.0f} %): "
            f"{'met' if med <= TARGET else 'NOT met'}; from every round's runs of the other "
            f"lengths against the median of its own: {statistics.median(pooled) * 100:.1f} %.",
        ]
    )
    print(text)
    if args.write_docs:
        sys.path.insert(0, str(ROOT / "bench"))
        from overhead import write_section

        write_section("spec_predict", text, script="bench/spec_predict.py")


if __name__ == "__main__":
    main()
