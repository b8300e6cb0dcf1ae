"""The README's report screenshots, made from real runs of the bundled model.

    python docs/screenshots.py [--tokens 64]

Runs SmolLM2-135M-Instruct (bundled) at the detailed level, requantizes it to Q8_0 and Q4_K_M
with `instr quantize` and runs both, then renders `instr summary`, `instr compare` and
`instr quant-report` as HTML and photographs each page in headless Chromium (Debian's `chromium`,
driven by Playwright): docs/img/summary.png, compare.png and quant-report.png, plus the HTML pages
themselves beside them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMG = ROOT / "docs" / "img"
PROMPT = "Explain in one paragraph why the sky is blue."
WIDTH = 1000
MAX_HEIGHT = 2400  # a screenshot shows the top of a long page: the README links the full page


def instr(*args: str) -> None:
    r = subprocess.run(["instr", *args], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        raise SystemExit(f"instr {' '.join(args)} failed: {last}")


def shoot(pages: dict[Path, Path], max_height: int = MAX_HEIGHT) -> None:
    """Photograph each HTML page (value) into its PNG (key), the top ``max_height`` pixels, in
    Debian's headless Chromium driven by Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        for png, html in pages.items():
            page = browser.new_page(viewport={"width": WIDTH, "height": 900})
            page.goto(html.resolve().as_uri())
            height = min(max_height, page.evaluate("document.body.scrollHeight"))
            page.screenshot(
                path=str(png),
                clip={"x": 0, "y": 0, "width": WIDTH, "height": height},
                full_page=True,
            )
            page.close()
            print(f"{png} ({height} px)", file=sys.stderr)
        browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT))
    from llamacpp_instr.native import models

    IMG.mkdir(parents=True, exist_ok=True)
    src = models.default_model()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        q = {t: tmp / f"SmolLM2-135M-Instruct.{t.upper()}.gguf" for t in ("q8_0", "q4_k_m")}
        for t, path in q.items():
            instr("quantize", str(src), "--type", t, "-o", str(path))
        logs = {}
        for t, path in q.items():
            # warm-up: the first run of a freshly written model reads it from disk (page faults
            # inside the first steps); the measured runs start with the file in the page cache
            instr("run", str(path), "-p", PROMPT, "-n", "4", "-o", str(tmp / f"{t}-warm.log"))
        for t, path in q.items():
            logs[t] = tmp / f"{t}.log"
            instr(
                "run", str(path), "-p", PROMPT, "-n", str(args.tokens), "--ignore-eos",
                "-o", str(logs[t]),
            )  # fmt: skip
        pages = {
            "summary": IMG / "summary.html",
            "compare": IMG / "compare.html",
            "quant-report": IMG / "quant-report.html",
        }
        instr("summary", str(logs["q8_0"]), "--format", "html", "-o", str(pages["summary"]))
        instr(
            "compare", str(logs["q8_0"]), str(logs["q4_k_m"]), "--format", "html",
            "-o", str(pages["compare"]),
        )  # fmt: skip
        instr(
            "quant-report", str(q["q8_0"]), str(q["q4_k_m"]), "--format", "html",
            "-o", str(pages["quant-report"]),
        )  # fmt: skip
        shoot({IMG / f"{name}.png": html for name, html in pages.items()})


if __name__ == "__main__":
    main()
