"""Where the experts live (issue 52 §4): -ot/--override-tensor, --n-cpu-moe and --cpu-moe in
`instr run` (and `instr serve`), passed through by `instr exec`, and the summary's per-layer table
of the expert tensors' buffers, devices and bytes.

Independent checks: the tensors' bytes are gguf-py's own (the GGUF file read without llama.cpp),
--n-cpu-moe's patterns are llama.cpp's (common/common.h) written out here, the Vulkan run's buffers
are llama.cpp's own memory breakdown, and the tokens of a placed run equal the unplaced run's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import PROMPT, assert_one_line_error, by_type, instr, read_log

EXPS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
N_LAYER = 4  # moe_small


def gguf_expert_bytes(model: Path) -> dict[str, int]:
    """Each expert tensor's bytes as gguf-py reads the file."""
    from gguf import GGUFReader

    return {
        t.name: int(t.n_bytes)
        for t in GGUFReader(model).tensors
        if any(t.name.endswith(f"{e}.weight") for e in EXPS)
    }


def run_tokens(log: Path) -> list[list[int]]:
    """The tokens each step decoded (DETAILED's step_begin.tokens)."""
    return [r["tokens"] for r in by_type(read_log(log), "step_begin")]


def summary_json(log: Path) -> dict[str, Any]:
    r = instr("summary", str(log), "--format", "json")
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def weights_by_name(log: Path) -> dict[str, dict[str, Any]]:
    (start,) = by_type(read_log(log), "session_start")
    return {w["name"]: w for w in start["weights"]}


# --- the rules, without llama.cpp ---


@pytest.mark.fast
def test_n_cpu_moe_patterns_are_llama_cpps() -> None:
    from llamacpp_instr.running.tensor_overrides import CPU, TensorOverrides, n_cpu_moe_patterns

    # common/common.h: llm_ffn_block_regex(i, LLM_FFN_EXPS_REGEX), to ggml_backend_cpu_buffer_type
    assert n_cpu_moe_patterns(2) == [
        r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps",
        r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps",
    ]
    t = TensorOverrides.from_options(["a=Vulkan0", r"b\.=CPU,c=X"], n_cpu_moe=1, cpu_moe=True)
    assert t.rules == (
        ("a", "Vulkan0"),
        (r"b\.", "CPU"),
        ("c", "X"),
        (r"\.ffn_(up|down|gate|gate_up)_(ch|)exps", CPU),
        (r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps", CPU),
    )
    assert not TensorOverrides.from_options([], n_cpu_moe=0)


def test_n_cpu_moe_selects_the_first_layers_experts(moe_small: Path) -> None:
    """Searched in the model's own tensor names (as llama.cpp's loader does, std::regex_search),
    --n-cpu-moe 2 picks the three expert tensors of layers 0 and 1 and nothing else."""
    from gguf import GGUFReader

    from llamacpp_instr.running.tensor_overrides import n_cpu_moe_patterns

    names = [t.name for t in GGUFReader(moe_small).tensors]
    picked = {n for n in names if any(re.search(p, n) for p in n_cpu_moe_patterns(2))}
    assert picked == {f"blk.{i}.{e}.weight" for i in (0, 1) for e in EXPS}


@pytest.mark.fast
@pytest.mark.parametrize(
    "value, words",
    [
        ("exps", "PATTERN=BUFFER_TYPE"),
        ("=CPU", "PATTERN=BUFFER_TYPE"),
        ("exps=", "PATTERN=BUFFER_TYPE"),
        ("(exps=CPU", "not a regular expression"),
        ("(?i)EXPS=CPU", "ECMAScript"),
        (r"(?<!blk\.0)\.ffn=CPU", "ECMAScript"),
    ],
)
def test_bad_override_is_one_line(value: str, words: str) -> None:
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.running.tensor_overrides import parse_override

    with pytest.raises(UserError, match=re.escape(words)):
        parse_override(value)


@pytest.mark.fast
def test_exec_passes_the_options_through(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """instr exec hands -ot, -ncmoe and -cmoe to the program as written."""
    from llamacpp_instr.cli import main
    from llamacpp_instr.native import tools
    from llamacpp_instr.running import child

    seen: list[list[str]] = []
    monkeypatch.setattr(
        tools, "find", lambda program, cmake_args=(), sanitize=None: Path("/bin/true")
    )
    monkeypatch.setattr(child, "run", lambda exe, argv, env: seen.append(list(argv)) or 0)
    monkeypatch.setattr(child, "end_like", lambda code: None)
    args = ["-m", "m.gguf", "-ngl", "99", "-ot", r"blk\.[01]\.ffn_.*=CPU", "-ncmoe", "2", "-cmoe"]
    r = CliRunner().invoke(main, ["exec", "-o", str(tmp_path / "x.log"), "llama-cli", *args])
    assert r.exit_code == 0, r.output
    assert seen == [["llama-cli", *args]]


# --- the CPU build ---


def test_bad_options_end_in_one_line(moe_small: Path, tmp_path: Path) -> None:
    common = ["run", str(moe_small), "-p", PROMPT, "-n", "1", "-o", str(tmp_path / "x.log")]
    assert_one_line_error(instr(*common, "-ot", "(exps=CPU"), "not a regular expression")
    assert_one_line_error(instr(*common, "-ot", "exps"), "PATTERN=BUFFER_TYPE")
    assert_one_line_error(instr(*common, "--n-cpu-moe", "-1"), "--n-cpu-moe")
    r = instr(*common, "-ot", "exps=NoSuchBuffer")
    assert_one_line_error(r, "unknown buffer type 'NoSuchBuffer'")
    assert "CPU" in r.stderr  # the buffer types there are
    assert not (tmp_path / "x.log").exists()
    r = instr("serve", str(moe_small), "-o", str(tmp_path / "s.log"), "-ot", "(exps=CPU")
    assert_one_line_error(r, "not a regular expression")


def test_serve_loads_with_the_rules(
    moe_small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """instr serve's model loads inside the rules: an unknown buffer type stops it there, before
    the log exists."""
    pytest.importorskip("uvicorn")
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.running import serve
    from llamacpp_instr.running.tensor_overrides import TensorOverrides

    monkeypatch.setattr(serve, "check_port", lambda host, port: None)  # nothing listens

    def loaded(llm: Any, api: Any) -> None:
        raise AssertionError("the server's model loaded without the rules")

    monkeypatch.setattr(serve, "instrument", loaded)  # it would serve: stop there
    tensors = TensorOverrides.from_options(["exps=NoSuchBuffer"])
    with pytest.raises(UserError, match="unknown buffer type 'NoSuchBuffer'"):
        serve.serve(moe_small, tmp_path / "s.log", tensors=tensors)
    assert not (tmp_path / "s.log").exists()


@pytest.fixture(scope="module")
def cpu_runs(moe_small: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("moe_place_cpu")
    logs = {}
    for name, extra in (
        ("plain", []),
        ("ot", ["-ot", r"blk\.[02]\.ffn_(up|down|gate)_exps=CPU"]),
        ("ncmoe", ["--n-cpu-moe", "2"]),
    ):
        log = out / f"{name}.log"
        r = instr("run", str(moe_small), "-p", PROMPT, "-n", "8", "--ignore-eos", "-t", "2",
                  "--level", "detailed", "-o", str(log), *extra)  # fmt: skip
        assert r.returncode == 0, r.stderr
        (log.parent / f"{name}.txt").write_text(r.stdout)
        logs[name] = log
    return logs


def test_cpu_override_runs_the_same_tokens(cpu_runs: dict[str, Path]) -> None:
    plain = run_tokens(cpu_runs["plain"])
    assert len(plain) == 8  # the prompt and 7 generated tokens decoded
    for name in ("ot", "ncmoe"):
        assert run_tokens(cpu_runs[name]) == plain, name
        assert (cpu_runs[name].parent / f"{name}.txt").read_text() == (
            cpu_runs["plain"].parent / "plain.txt"
        ).read_text()


def test_cpu_override_reaches_the_loader(moe_small: Path) -> None:
    """llama.cpp's loader says, for each tensor an override placed (its debug log, caught here
    through llama_log_set), "tensor NAME (...) buffer type overridden to CPU": exactly the tensors
    the pattern names; without the option, none."""
    import ctypes

    from llama_cpp import _logger

    from llamacpp_instr.native import bindings
    from llamacpp_instr.running import runner
    from llamacpp_instr.running.tensor_overrides import TensorOverrides

    llama_cpp = bindings.import_llama_cpp()
    said: list[str] = []

    @llama_cpp.llama_log_callback  # type: ignore[misc]
    def catch(level: int, text: bytes, user_data: Any) -> None:
        said.append(text.decode(errors="replace"))

    def overridden(tensors: TensorOverrides) -> set[str]:
        said.clear()
        cfg = runner.RunConfig(model=moe_small, prompt="x", n_ctx=64, threads=2, tensors=tensors)
        runner.load_model(cfg).close()
        text = "".join(said)
        return set(re.findall(r"tensor (\S+) \([^)]*\) buffer type overridden to CPU", text))

    llama_cpp.llama_log_set(catch, ctypes.c_void_p(0))
    try:
        placed = overridden(
            TensorOverrides.from_options([r"blk\.[02]\.ffn_(up|down|gate)_exps=CPU"])
        )
        ncmoe = overridden(TensorOverrides.from_options(n_cpu_moe=3))
        none = overridden(TensorOverrides())
    finally:
        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
    assert placed == {f"blk.{i}.{e}.weight" for i in (0, 2) for e in EXPS}
    assert ncmoe == {f"blk.{i}.{e}.weight" for i in (0, 1, 2) for e in EXPS}
    assert none == set()


def test_the_log_records_the_rules(cpu_runs: dict[str, Path]) -> None:
    (start,) = by_type(read_log(cpu_runs["ot"]), "session_start")
    assert start["metadata"]["config"]["tensors"]["rules"] == [
        [r"blk\.[02]\.ffn_(up|down|gate)_exps", "CPU"]
    ]


def test_summary_shows_the_experts(cpu_runs: dict[str, Path], moe_small: Path) -> None:
    sizes = gguf_expert_bytes(moe_small)
    assert len(sizes) == 3 * N_LAYER
    for name in ("plain", "ot"):
        weights = weights_by_name(cpu_runs[name])
        data = summary_json(cpu_runs[name])
        tensors = {t["name"]: t for t in data["experts_placement"]}
        assert {n: t["bytes"] for n, t in tensors.items()} == sizes
        assert {n: t["buffer"] for n, t in tensors.items()} == {
            n: weights[n]["buffer"] for n in sizes
        }
        assert {t["device"] for t in tensors.values()} == {"CPU"}
        assert data["expert_bytes_per_device"] == {"CPU": sum(sizes.values())}
    r = instr("summary", str(cpu_runs["ot"]))
    assert r.returncode == 0, r.stderr
    assert "Where the experts live" in r.stdout


def test_dense_model_has_no_experts_section(smollm2_path: Path, tmp_path: Path) -> None:
    log = tmp_path / "dense.log"
    r = instr("run", str(smollm2_path), "-p", PROMPT, "-n", "1", "--level", "minimal",
              "-o", str(log))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "experts_placement" not in summary_json(log)


# --- Vulkan (lavapipe) ---


@pytest.mark.vulkan
def test_vulkan_n_cpu_moe_keeps_the_first_layers_experts_on_the_cpu(
    moe_small: Path, tmp_path: Path
) -> None:
    from helpers.vulkan_backend import vulkan_device, vulkan_env

    vk = vulkan_device()
    env = vulkan_env()
    logs = {}
    for name, extra in (("plain", []), ("ncmoe", ["--n-cpu-moe", "2"])):
        log = tmp_path / f"{name}.log"
        r = instr("run", str(moe_small), "-p", PROMPT, "-n", "6", "--ignore-eos", "-t", "2",
                  "-ngl", "99", "--level", "detailed", "-o", str(log), *extra,
                  env=env)  # fmt: skip
        assert r.returncode == 0, r.stderr
        logs[name] = log
    assert run_tokens(logs["ncmoe"]) == run_tokens(logs["plain"])

    sizes = gguf_expert_bytes(moe_small)
    data = summary_json(logs["ncmoe"])
    tensors = {t["name"]: t for t in data["experts_placement"]}
    assert {n: t["bytes"] for n, t in tensors.items()} == sizes
    for t in tensors.values():
        on_cpu = t["layer"] in (0, 1)
        assert (t["device"] == "CPU") == on_cpu, t
        assert t["buffer"].startswith("CPU") == on_cpu, t
        assert (t["device"] == vk and t["buffer"] == vk) == (not on_cpu), t
    cpu_bytes = sum(s for n, s in sizes.items() if n.startswith(("blk.0.", "blk.1.")))
    assert data["expert_bytes_per_device"] == {
        "CPU": cpu_bytes,
        vk: sum(sizes.values()) - cpu_bytes,
    }
    plain = summary_json(logs["plain"])
    assert plain["expert_bytes_per_device"] == {vk: sum(sizes.values())}

    # llama.cpp's own breakdown: the device's weights shrink by the experts kept on the CPU
    def breakdown(log: Path) -> dict[str, int]:
        (start,) = by_type(read_log(log), "session_start")
        return {b["buffer"]: int(b["weights"]) for b in start["memory"]["buffers"]}

    before, after = breakdown(logs["plain"]), breakdown(logs["ncmoe"])
    shrink = before[vk] - after[vk]
    assert 0 <= shrink - cpu_bytes < 6 * 256, (before, after, cpu_bytes)  # alignment only
