"""The README's quantization choice, from scratch: an F16 base of the bundled SmolLM2-135M made with
`instr quantize --type f16`, swept over six types with `instr quant-sweep`, plus where the error
enters for Q4_K_M (`instr quant-eval --layers`).

    python bench/quant_sweep.py [--chunks 8] [--reps 3] [--write-docs]

Writes (with --write-docs) the `sweep` section of docs/quantization.md, the sweep's HTML page and
its screenshot under docs/img/, and prints the markdown. The bundled file is Q4_1, so the F16 base
is itself a dequantization of it: absolute quality is below the original model's, but every type
is compared with the same base, like for like.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TYPES = "q8_0,q6_k,q5_k_m,q4_k_m,q3_k_m,q2_k"


def instr(*args: str) -> str:
    r = subprocess.run(["instr", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"instr {' '.join(args)} failed: {r.stderr.strip().splitlines()[-1]}")
    return r.stdout


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()

    from bench.overhead import write_section  # type: ignore[import-not-found]
    from llamacpp_instr.native import models
    from llamacpp_instr.native.paths import cache_dir

    src = models.default_model()
    base = cache_dir() / "bench-sweep" / "SmolLM2-135M-Instruct.F16.gguf"
    if not base.is_file():
        base.parent.mkdir(parents=True, exist_ok=True)
        instr("quantize", str(src), "--type", "f16", "-o", str(base))
    img = ROOT / "docs" / "img"
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        common = ["--types", TYPES, "--chunks", str(args.chunks), "--reps", str(args.reps)]
        t0 = time.monotonic()
        instr("quant-sweep", str(base), *common, "--format", "json", "-o", str(tmp / "s.json"))
        took = time.monotonic() - t0
        data = json.loads((tmp / "s.json").read_text())
        # the report in markdown and html from the same data (no second measurement)
        from llamacpp_instr.converters.reports.quant.sweep_report import sweep_report
        from llamacpp_instr.converters.reports.renderers import render

        report = sweep_report(data)
        md = render(report, "markdown")
        html_page = render(report, "html")
        q4 = next(m["path"] for m in data["models"] if m["type"] == "q4_k_m")
        layers_md = instr(
            "quant-eval", str(base), q4, "--chunks", "4", "--layers", "--format", "markdown"
        )
    body = "\n".join(
        [
            f"Base: `{base.name}` (made with `instr quantize --type f16` from the bundled Q4_1), "
            f"types {TYPES.replace(',', ', ')}; {args.reps} interleaved speed repetitions, "
            f"{args.chunks} chunks of 512 tokens of the bundled text scored; 2 cores; "
            f"{took / 60:.1f} minutes.",
            "",
            md.split("\n", 2)[2],  # without the report's own title
            "",
            "### Where the error enters: Q4_K_M",
            "",
            layers_md.split("## Where the error enters", 1)[-1].split("\n", 1)[-1],
        ]
    )
    print(body)
    if args.write_docs:
        (img / "quant-sweep.html").write_text(html_page)
        write_section(
            "sweep", body, doc=ROOT / "docs" / "quantization.md", script="bench/quant_sweep.py"
        )
        from docs.screenshots import shoot  # type: ignore[import-not-found]

        shoot({img / "quant-sweep.png": img / "quant-sweep.html"}, max_height=1800)


if __name__ == "__main__":
    main()
