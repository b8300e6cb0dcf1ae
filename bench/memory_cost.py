"""What each step's memory figures cost: the reads ``write_step_memory`` makes on every
step at every level (``/proc/self/statm``, and each CPU device's memory query: ``sysconf`` twice),
timed in a C++ loop compiled here, against a generation step of SmolLM2 at MINIMAL measured in the
same run. The ratio is the share of a generation step the figures take.

    python bench/memory_cost.py [--write-docs]

The KV-cell count (a few loads per cache) and the JSON (about 150 bytes) are not in the loop: they
cost well under a microsecond. A GPU's memory query (Vulkan: vkGetPhysicalDeviceMemoryProperties2
with the budget extension) is not measured here (no GPU); an RPC device's is never made per step.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LOOP = r"""
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <unistd.h>
int main(int argc, char ** argv) {
    const int n = argc > 1 ? atoi(argv[1]) : 20000;
    unsigned long long acc = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; i++) {
        int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
        char buf[128];
        ssize_t r = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        buf[r > 0 ? r : 0] = 0;
        unsigned long long a = 0, b = 0, c = 0;
        sscanf(buf, "%llu %llu %llu", &a, &b, &c);
        acc += b + c + (unsigned long long) sysconf(_SC_PHYS_PAGES) + sysconf(_SC_PAGE_SIZE);
    }
    auto t1 = std::chrono::steady_clock::now();
    printf("%.3f %llu\n", std::chrono::duration<double, std::nano>(t1 - t0).count() / n, acc % 7);
}
"""


def read_cost_ns(reps: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d) / "loop.cpp", Path(d) / "loop"
        src.write_text(LOOP)
        subprocess.run(["g++", "-O2", "-o", str(exe), str(src)], check=True)
        runs = [float(subprocess.check_output([str(exe)]).split()[0]) for _ in range(reps)]
    return statistics.median(runs)


def gen_step_ns(tokens: int) -> float:
    from llamacpp_instr.converters.reading.reader import iter_records
    from llamacpp_instr.native import models
    from llamacpp_instr.running import runner

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "s.log"
        cfg = runner.RunConfig(
            model=models.default_model(),
            prompt="The capital of France is",
            n_predict=tokens,
            threads=2,
            level="minimal",
            out=out,
            ignore_eos=True,
        )
        runner.run(cfg)
        begins = {}
        durs = []
        for _, r in iter_records(out):
            if r["type"] == "step_begin":
                begins[r["step"]] = r["kind"]
            elif r["type"] == "step_end" and begins.get(r["step"]) == "gen":
                durs.append(float(r["dur"]))
    return statistics.median(durs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    read = read_cost_ns(args.reps)
    step = gen_step_ns(args.tokens)
    line = (
        f"per-step memory reads {read / 1000:.1f} us, a SmolLM2 generation step at minimal "
        f"{step / 1e6:.2f} ms (median of {args.tokens}): {read / step:.2%} of a step"
    )
    print(line)
    if args.write_docs:
        doc = Path(__file__).resolve().parent.parent / "docs" / "performance.md"
        text = doc.read_text()
        start, end = "<!-- bench:memory_cost -->", "<!-- /bench:memory_cost -->"
        i, j = text.index(start) + len(start), text.index(end)
        doc.write_text(text[:i] + "\n" + line + "\n" + text[j:])


if __name__ == "__main__":
    main()
