"""The README's SmolLM2-135M Q4_K_M vs Q8_0 comparison, regenerated from scratch.

    python bench/quant_compare.py [--tokens 32] [--screenshot]

Quantizes the bundled SmolLM2-135M-Instruct (shipped as Q4_1, so this requantizes: absolute
quality is below a quantization from F16, but the two results are compared like for like) to
Q4_K_M and Q8_0 with `instr quantize`, reports both with `instr quant-report`, runs the same
greedy prompt on each at the verbose level and compares the runs with `instr compare`. Writes
docs/quantization.md and docs/quantization.html (with --screenshot, also a PNG of the HTML taken
with headless Chromium, to check it renders).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT = "Explain in one paragraph why the sky is blue."


def instr(*args: str) -> str:
    r = subprocess.run(["instr", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"instr {' '.join(args)} failed: {r.stderr.strip().splitlines()[-1]}")
    return r.stdout


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--screenshot", action="store_true")
    args = ap.parse_args()

    from llamacpp_instr import models

    src = models.default_model()
    docs = ROOT / "docs"
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        q = {t: tmp / f"SmolLM2-135M-Instruct.{t.upper()}.gguf" for t in ("q8_0", "q4_k_m")}
        for t, path in q.items():
            instr("quantize", str(src), "--type", t, "-o", str(path))
        report_md = instr(
            "quant-report", str(q["q8_0"]), str(q["q4_k_m"]), "--format", "markdown", "--top", "8"
        )
        instr(
            "quant-report",
            str(q["q8_0"]),
            str(q["q4_k_m"]),
            "--format",
            "html",
            "-o",
            str(docs / "quantization.html"),
        )
        logs = {}
        for t, path in q.items():
            logs[t] = tmp / f"{t}.log"
            instr("run", str(path), "--prompt", PROMPT, "-n", str(args.tokens), "--threads", "2",
                  "--level", "verbose", "--ignore-eos", "--out", str(logs[t]))  # fmt: skip
        cmp_text = instr("compare", str(logs["q8_0"]), str(logs["q4_k_m"]))
        cmp_json = json.loads(
            instr("compare", str(logs["q8_0"]), str(logs["q4_k_m"]), "--format", "json")
        )

    tok = cmp_json["tokens"]
    lg = cmp_json.get("logits", {})
    md = [
        "# SmolLM2-135M: Q4_K_M vs Q8_0",
        "",
        f"_Generated {time.strftime('%Y-%m-%d')} by `bench/quant_compare.py` on a 2-core machine; "
        f"prompt {PROMPT!r}, {args.tokens} greedy tokens, 2 threads, verbose logs._",
        "",
        "The bundled model is Q4_1, so both files are requantized from it (the comparison is like "
        "for like, but not what quantizing from F16 would give).",
        "",
        "## Run",
        "",
        "```",
        cmp_text.rstrip(),
        "```",
        "",
        f"Generated tokens identical: {tok['agree']}/{tok['compared']}; top-1 agreement "
        f"{lg.get('top1_agreement', 0):.0%}; KL(Q8_0 || Q4_K_M) estimate from the top-10 logits: "
        f"mean {lg.get('kl_mean', 0):.4f}. After the first divergence the two runs continue on "
        "different text, so later steps compare different contexts; the steps before it compare "
        "the same context.",
        "",
        "## Where the bytes go",
        "",
        report_md.rstrip(),
        "",
        "Charts: [quantization.html](quantization.html) (bytes per layer by type, bits per weight by role).",
        "",
    ]
    (docs / "quantization.md").write_text("\n".join(md))
    print((docs / "quantization.md").read_text())
    if args.screenshot:
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if not chromium:
            raise SystemExit("--screenshot needs chromium (apt-get install chromium)")
        png = Path(tempfile.gettempdir()) / "quantization.png"
        subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run",
             f"--user-data-dir={tempfile.mkdtemp()}", f"--screenshot={png}", "--window-size=900,1400",
             (docs / "quantization.html").as_uri()],
            check=True, capture_output=True,
        )  # fmt: skip
        print(f"screenshot: {png}")


if __name__ == "__main__":
    main()
