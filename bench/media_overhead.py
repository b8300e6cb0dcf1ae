"""What recording an image run costs: DETAILED (every op of the encoder's graph timed, its node
table, the media records) against MINIMAL (steps and layer spans), levels alternated in one
process.

    python bench/media_overhead.py [--rounds 20] [--image-size 512] [--layers 6] [--width 256]
                                   [--threads 2] [--write-docs]

The bundled SmolLM2-135M with a random-weight gemma3 projector (tests/helpers/mmproj_gguf.py; one
encode per image, its size set by --image-size, --layers and --width so that the encode is a
real share of the run) and mtmd's test-1.jpeg. One process and one session: each round runs the
image twice, once at each level (`llama_instr_set_level`), the order alternating round by round:
the model's memory cleared, the prompt with the image tokenized, encoded and decoded, and 4
tokens generated (llamacpp_instr.running.media, as `instr run --mmproj --image` does). A run's time
is its wall time; reported per level: the median, the ratio of the medians and the median of the
rounds' ratios (paired). Target: DETAILED at least 0.98x of MINIMAL.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from helpers.mmproj_gguf import write_vision_mmproj  # noqa: E402
from overhead import write_section  # noqa: E402

from llamacpp_instr.native import bindings, build, models, pin  # noqa: E402
from llamacpp_instr.running import api, runner  # noqa: E402
from llamacpp_instr.running.media import Media  # noqa: E402
from llamacpp_instr.running.run_config import MediaInputs  # noqa: E402

LEVELS = ("minimal", "detailed")


def test_image(dest: Path) -> Path:
    """mtmd's test-1.jpeg, from the pinned sdist."""
    folder = f"llama_cpp_python-{pin.LLAMA_CPP_PYTHON_VERSION}/{pin.VENDOR_DIR}/tools/mtmd/"
    with tarfile.open(build.fetch_sdist(lambda m: None)) as tf:
        member = tf.extractfile(folder + "test-1.jpeg")
        assert member is not None
        dest.write_bytes(member.read())
    return dest


def encode_facts(log: Path) -> tuple[int, list[float]]:
    """The image's tokens (its `media` record) and, per encode at DETAILED, its ops' time over
    its own (the compute's ops summed, over the step's dur)."""
    import json

    recs = [json.loads(line) for line in log.read_text().splitlines()]
    tokens = next(r["tokens"] for r in recs if r["type"] == "media")
    begins = {(r["ctx"], r["step"]): r for r in recs if r["type"] == "step_begin"}
    ops: dict[tuple[int, int], int] = {}
    for r in recs:
        if r["type"] == "compute" and "ops" in r:
            key = (r["ctx"], r["step"])
            ops[key] = ops.get(key, 0) + sum(o[2] for o in r["ops"])
    coverage = [
        ops[(r["ctx"], r["step"])] / r["dur"]
        for r in recs
        if r["type"] == "step_end"
        and begins[(r["ctx"], r["step"])]["kind"] == "encode"
        and begins[(r["ctx"], r["step"])]["level"] == "detailed"
    ]
    return tokens, coverage


def one_run(llm: object, media: Media, prompt: str) -> float:
    """The image's way through, once: memory cleared, encoded, decoded, 4 tokens; wall seconds."""
    t0 = time.perf_counter()
    llm.reset()  # type: ignore[attr-defined]
    tokens = media.evaluate(prompt, True)
    for i, _ in enumerate(llm.generate(tokens, temp=0.0, reset=True)):  # type: ignore[attr-defined]
        if i == 3:
            break
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--image-size", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()

    lib = bindings.load()
    tmp = Path(tempfile.mkdtemp(prefix="media-overhead."))
    mmproj = write_vision_mmproj(
        tmp / "gemma3.gguf",
        projector="gemma3",
        image_size=args.image_size,
        n_layer=args.layers,
        n_embd=args.width,
        n_ff=4 * args.width,
    )
    image = test_image(tmp / "test-1.jpeg")
    inputs = MediaInputs(mmproj, (image,))
    inputs.validate()
    cfg = runner.RunConfig(
        model=models.default_model(), prompt="", threads=args.threads, media=inputs
    )
    llm = runner.load_model(cfg)
    media = Media(llm, cfg)
    prompt = media.with_markers("Describe the image.")
    times: dict[str, list[float]] = {level: [] for level in LEVELS}
    with api.session(llm, tmp / "bench.log", "detailed"):
        for level in LEVELS:  # warm-up: each level's graphs built and computed once
            lib.set_level(level)
            one_run(llm, media, prompt)
        for r in range(args.rounds):
            order = LEVELS if r % 2 == 0 else LEVELS[::-1]
            for level in order:
                lib.set_level(level)
                times[level].append(one_run(llm, media, prompt))
    media.close()
    llm.close()
    tokens, coverage = encode_facts(tmp / "bench.log")

    med = {level: statistics.median(times[level]) for level in LEVELS}
    paired = statistics.median(
        m / d for m, d in zip(times["minimal"], times["detailed"], strict=True)
    )
    lines = [
        f"SmolLM2-135M-Instruct Q4_1 with a random-weight gemma3 projector ({args.layers} layers, "
        f"{args.width} wide, {args.image_size}-pixel images), mtmd's test-1.jpeg, {args.threads} "
        f"threads; {args.rounds} rounds, each running the image at both levels in one process "
        f"(encode, decode of its {tokens} tokens and of the prompt's text, 4 generated tokens):",
        "",
        "| level | median run (ms) | speed vs MINIMAL (ratio of medians) | paired |",
        "|---|---|---|---|",
    ]
    for level in LEVELS:
        ratio = med["minimal"] / med[level]
        pair = 1.0 if level == "minimal" else paired
        lines.append(f"| {level} | {med[level] * 1000:.1f} | {ratio:.3f}x | {pair:.3f}x |")
    lines += [
        "",
        "Timed ops over each DETAILED encode's time (its whole mtmd call): median "
        f"{statistics.median(coverage):.1%}, lowest {min(coverage):.1%} ({len(coverage)} encodes).",
    ]
    report = "\n".join(lines)
    print(report)
    if args.write_docs:
        write_section("media_overhead", report)


if __name__ == "__main__":
    main()
