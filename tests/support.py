"""Helpers shared by the test modules, defined once (test modules import from here, never from each
other; conftest.py holds the fixtures and puts this directory on sys.path)."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

TESTS_DIR = Path(__file__).resolve().parent
FIXTURES = TESTS_DIR / "fixtures"
REAL_FIXTURES = sorted(FIXTURES.glob("*.log.gz"))
PROMPT = "The capital of France is"
# CI runs a fixed, reproducible set of examples; `FUZZ_EXAMPLES=20000 pytest -k fuzz` explores more
FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "300"))
FUZZ_DERANDOMIZE = "FUZZ_EXAMPLES" not in os.environ

# fuzzed JSON values, for the fields of records the converters must pass through or reject:
# integers past 64 bits (what no C side writes, and Python's json reads), lists and objects
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


def read_log(path: Path) -> list[dict[str, Any]]:
    """Every line of a log, plain or .gz, parsed with the standard library (independent of
    converters/): a blank or damaged line fails."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        return [json.loads(line) for line in f]


def by_type(records: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] == type_]


def write_log(path: Path, recs: list[Any]) -> Path:
    """``recs`` as a plain log at ``path``, one JSON line each."""
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def plain_copy(src: Path, tmp_path: Path) -> Path:
    """A .gz fixture as a plain log in ``tmp_path``."""
    dest = tmp_path / src.name.removesuffix(".gz")
    dest.write_text("".join(json.dumps(r) + "\n" for r in read_log(src)))
    return dest


def make_run(model: Path, out: Path, level: str, **kw: Any) -> Any:
    """A real run through ``runner.run``: fixed length (tiny random models hit EOS early)."""
    from llamacpp_instr import runner

    cfg = runner.RunConfig(
        model=model,
        prompt=kw.pop("prompt", PROMPT),
        n_predict=kw.pop("n_predict", 12),
        threads=kw.pop("threads", 2),
        n_ctx=kw.pop("n_ctx", 512),
        ignore_eos=kw.pop("ignore_eos", True),
        level=level,
        out=out,
        **kw,
    )
    return runner.run(cfg)


class RunLog:
    """A real run and its parsed log."""

    def __init__(self, result: Any) -> None:
        self.result = result
        self.path: Path = result.log_path
        self.records = read_log(self.path)

    def of(self, type_: str) -> list[dict[str, Any]]:
        return by_type(self.records, type_)

    @property
    def start(self) -> dict[str, Any]:
        return self.records[0]


def hand_bytes(path: Path) -> int:
    """A GGUF's tensor bytes from each tensor's element count and its type's block size."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

    total = 0
    for t in GGUFReader(path).tensors:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(int(t.tensor_type))]
        total += int(t.n_elements) // block * size
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(
    port: int, proc: subprocess.Popen[str], timeout: float = 120, path: str = "/v1/models"
) -> None:
    """Until the server ``proc`` (instr serve, llama-server) answers ``path`` on ``port``; fails
    if it exits first."""
    import urllib.request

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"the server did not answer {path}")
