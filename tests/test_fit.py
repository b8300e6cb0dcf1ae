"""instr fit (issue 34, part 3): the setting it names runs under the memory it was given, one
context step beyond it fails with the out-of-memory line, and a real run's buffers (counted here
from the log's memory_alloc / memory_free records) are within 2 % of its projection per device.
Beside it, llama.cpp's own llama-fit-params at the same setting (when built)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from helpers.support import PROMPT, instr, read_log

pytestmark = pytest.mark.native

MIB = 1 << 20


def fit_json(*args: str) -> dict[str, Any]:
    r = instr("fit", *args, "--format", "json")
    assert r.returncode == 0, r.stderr
    (answer,) = json.loads(r.stdout)
    return dict(answer)


def run_args(answer: dict[str, Any], n_ctx: int) -> list[str]:
    """instr run's options for the answer's setting at ``n_ctx`` (written here from the JSON, not
    taken from instr fit's own text)."""
    args = ["--ctx", str(n_ctx), "-ctk", answer["type_k"], "-ctv", answer["type_v"]]
    return args + FLASH_ARGS[answer["flash_attn"]]


# instr run's flash attention option of fit's answer ("auto": none, llama.cpp's default)
FLASH_ARGS = {"auto": [], "on": ["--flash-attn"], "off": ["--no-flash-attn"]}


def live_per_device(log: Path) -> dict[int, dict[str, int]]:
    """{device index: {purpose: bytes}} of the buffers live when the log's last step ended."""
    live: dict[int, dict[str, Any]] = {}
    at_end: dict[int, dict[str, Any]] = {}
    for r in read_log(log):
        if r["type"] == "memory_alloc":
            live[r["id"]] = r
        elif r["type"] == "memory_free":
            live.pop(r["id"], None)
        elif r["type"] == "step_end":
            at_end = dict(live)
    assert at_end, "no step ended with buffers live"
    out: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for b in at_end.values():
        out[b["device"]][b["purpose"]] += b["bytes"]
    return out


def device_names(log: Path) -> dict[int, str]:
    start = read_log(log)[0]
    return {d["index"]: d["name"] for d in start["machine"]["devices"]}


def check_fit_runs_and_next_step_fails(model: Path, budget: int, tmp_path: Path) -> None:
    answer = fit_json(str(model), "--memory", f"CPU={budget}")
    assert answer["fits"], answer
    n_ctx = answer["n_ctx"]
    assert n_ctx % 256 == 0
    # the budget must cut the context short, or there is no step beyond to fail
    assert n_ctx + 256 <= answer["n_ctx_train"], answer
    footprint = answer["footprint"]
    assert sum(footprint["CPU"].values()) <= budget

    log = tmp_path / "fits.log"
    common = ["-p", PROMPT, "-n", "2", "--level", "minimal", "--memory-budget", f"CPU={budget}"]
    r = instr("run", str(model), *common, "-o", str(log), *run_args(answer, n_ctx))
    assert r.returncode == 0, r.stderr

    # what the run held, per device and purpose, against the projection: within 2 %
    names = device_names(log)
    measured = {names[i]: dict(p) for i, p in live_per_device(log).items()}
    assert set(measured) == set(footprint), (measured, footprint)
    for dev, purposes in footprint.items():
        projected, used = sum(purposes.values()), sum(measured[dev].values())
        assert abs(used - projected) <= 0.02 * projected, (dev, used, projected)
        # the compute buffers alone, as the log counts them
        assert abs(measured[dev]["compute"] - purposes["compute"]) <= 0.02 * purposes["compute"]
        assert measured[dev]["kv_cache"] == purposes["kv_cache"]

    # one context step beyond: out of memory, one line, exit 3
    r = instr("run", str(model), *common, "-o", str(tmp_path / "beyond.log"),
              *run_args(answer, n_ctx + 256))  # fmt: skip
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: out of memory on CPU"), r.stderr


def test_smollm2_the_setting_fit_names_runs_and_one_step_beyond_fails(
    instr_api: Any, smollm2_path: Path, tmp_path: Path
) -> None:
    # 260 MiB: the weights (92 MiB) and compute (~100 MiB) leave room for part of the context
    check_fit_runs_and_next_step_fails(smollm2_path, 260 * MIB, tmp_path)


def test_tiny_model_the_setting_fit_names_runs_and_one_step_beyond_fails(
    instr_api: Any, tmp_path: Path
) -> None:
    from helpers.tiny_gguf import write_tiny_model

    model = write_tiny_model(tmp_path / "tiny.gguf", n_ctx_train=8192, dtype="f32", seed=5)
    whole = fit_json(str(model))  # no budget: the whole context fits
    assert whole["n_ctx"] == 8192 and whole["type_k"] == "f16", whole
    # 16 MiB: the whole context takes 96 MiB with an f16 cache, 23 MiB with q8_0 and flash
    # attention (whose compute buffer does not hold the whole KQ matrix)
    check_fit_runs_and_next_step_fails(model, 16 * MIB, tmp_path)


def check_most_layers_run_and_one_more_fails(
    model: Path, device: str, budget: int, place: list[str], tmp_path: Path,
    env: dict[str, str] | None = None,
) -> None:  # fmt: skip
    """fit searches -ngl under a budget on ``device`` (the whole 4096 context fits): the layers it
    names run, measured within 2 % per device, and one layer more fails on ``device``."""
    r = instr("fit", str(model), *place, "--ctx", "4096", "--memory", f"{device}={budget}",
              "--format", "json", env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    (answer,) = json.loads(r.stdout)
    assert answer["n_ctx"] == 4096, answer
    ngl = answer["n_gpu_layers"]
    assert 0 < ngl < 3, answer  # of 2 layers and the output
    assert sum(answer["footprint"][device].values()) <= budget
    # the KV cache type it names (a device's compute buffers may leave room only for q8_0)
    kv = ["-ctk", answer["type_k"], "-ctv", answer["type_v"]]
    kv += FLASH_ARGS[answer["flash_attn"]]
    common = ["-p", PROMPT, "-n", "2", "--level", "minimal", *place, *kv,
              "--memory-budget", f"{device}={budget}", "--ctx", "4096"]  # fmt: skip
    log = tmp_path / "layers.log"
    r = instr("run", str(model), *common, "-ngl", str(ngl), "-o", str(log), env=env)
    assert r.returncode == 0, r.stderr
    names = device_names(log)
    measured = {names[i]: sum(p.values()) for i, p in live_per_device(log).items()}
    assert set(measured) == set(answer["footprint"]), (measured, answer["footprint"])
    for dev, purposes in answer["footprint"].items():
        projected = sum(purposes.values())
        assert abs(measured[dev] - projected) <= 0.02 * projected, (dev, measured, projected)
    r = instr("run", str(model), *common, "-ngl", str(ngl + 1), "-o", str(tmp_path / "x.log"),
              env=env)  # fmt: skip
    assert r.returncode == 3, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: out of memory on {device}")


# at 4096 cells, with flash attention (llama.cpp's auto), two of the tiny model's three offloaded
# layers (two blocks and the output) fit in this on the device and all three do not (18.4 MB)
LAYERS_BUDGET = 16 * MIB
# on lavapipe, with a q8_0 cache and flash attention, 2 of the 3 fit in this (all 3 take 15.9 MB)
VULKAN_LAYERS_BUDGET = 13 * MIB


def test_rpc_fit_names_the_most_layers_and_one_more_fails(instr_api: Any, tmp_path: Path) -> None:
    """With a device to offload to (an RPC server on loopback: a GPU to llama.cpp)."""
    from helpers.rpc_backend import rpc_server
    from helpers.tiny_gguf import write_tiny_model

    model = write_tiny_model(tmp_path / "tiny.gguf", n_ctx_train=8192, dtype="f32", seed=5)
    with rpc_server() as endpoint:
        check_most_layers_run_and_one_more_fails(
            model, "RPC0", LAYERS_BUDGET, ["--rpc", endpoint], tmp_path
        )


def test_context_params_are_instr_runs(instr_api: Any, tiny_llama_f32: Path) -> None:
    """Every field of the context parameters fit probes with equals llama_cpp.Llama's for the
    same RunConfig (what instr run loads)."""
    import ctypes

    from llamacpp_instr.running import footprint, runner

    pointers = {"cb_eval", "cb_eval_user_data", "abort_callback", "abort_callback_data"}
    configs = [
        runner.RunConfig(model=tiny_llama_f32, prompt="x", n_ctx=512),
        runner.RunConfig(model=tiny_llama_f32, prompt="x", n_ctx=256, n_batch=512, n_ubatch=128),
        runner.RunConfig(
            model=tiny_llama_f32, prompt="x", n_ctx=1024, flash_attn=True,
            type_k="q8_0", type_v="q8_0", threads=1,
        ),
    ]  # fmt: skip
    compared = 0
    for cfg in configs:
        llm = runner.load_model(cfg)
        try:
            ours, theirs = footprint.context_params(cfg), llm.context_params
            for name, _ in theirs._fields_:
                if name in pointers or isinstance(getattr(theirs, name), ctypes._Pointer):
                    continue
                assert getattr(ours, name) == getattr(theirs, name), (name, cfg)
                compared += 1
        finally:
            llm.close()
    assert compared > 3 * 20


def test_projection_is_llamas_own_breakdown(instr_api: Any, smollm2_path: Path) -> None:
    """With no budget and the default setting, weights and KV cache equal a real instr run's
    buffers to the byte (independent of llama.cpp's breakdown, which the projection is)."""
    answer = fit_json(str(smollm2_path), "--ctx", "1024")
    assert answer["n_ctx"] == 1024 and answer["type_k"] == "f16"
    from test_memory import gguf_kv_bytes

    assert answer["footprint"]["CPU"]["kv_cache"] == gguf_kv_bytes(smollm2_path, 1024)


def test_llama_fit_params_beside(instr_api: Any, smollm2_path: Path, tools_bin: Path) -> None:
    # tools_bin builds llama-fit-params from the pin when the cache lacks it (a cold CI run used
    # to skip this test, the first to need the tools)
    assert (tools_bin / "llama-fit-params").exists()
    # weights as in the file (-nr, passed on to llama-fit-params): its host row leaves out the
    # CPU's extra buffer types (AMX, CPU_REPACK) and the file's mapping, which a run holds
    answer = fit_json(
        str(smollm2_path), "--memory", f"CPU={260 * MIB}", "--compare-llama", "--no-repack"
    )
    theirs = answer["llama_fit_params"]["CPU"]
    for purpose in ("weights", "kv_cache", "compute"):
        # llama-fit-params prints MiB, rounded down
        assert theirs[purpose] == answer["footprint"]["CPU"][purpose] // MIB, (purpose, theirs)


def test_quant_answers_for_the_file_quantized(instr_api: Any, tiny_llama_f32: Path) -> None:
    """--quant q8_0: the answer is about the file quantized into the cache, whose weights are
    its tensors' bytes (read here with gguf-py)."""
    from gguf import GGUFReader

    # weights as in the file (-nr): a CPU that repacks Q8_0 (AMX) holds a copy beside the mapping
    r = instr(
        "fit", str(tiny_llama_f32), "--quant", "f32", "--quant", "q8_0", "--format", "json", "-nr"
    )
    assert r.returncode == 0, r.stderr
    own, q8 = json.loads(r.stdout)
    assert (own["quant"], q8["quant"]) == ("f32", "q8_0")
    assert own["model"] == str(tiny_llama_f32) and q8["model"] != own["model"]
    reader = GGUFReader(q8["model"])
    assert {t.tensor_type.name for t in reader.tensors} >= {"Q8_0"}
    tensor_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    weights = q8["footprint"]["CPU"]["weights"]
    assert tensor_bytes <= weights <= tensor_bytes * 1.01, (weights, tensor_bytes)
    assert weights < own["footprint"]["CPU"]["weights"] / 2


def test_nothing_fits_exits_3(instr_api: Any, tiny_llama_f32: Path) -> None:
    """Less memory than the weights: no setting fits; the answer says which device overflows
    and the command exits 3, as a run that does not fit does."""
    from gguf import GGUFReader

    weights = sum(int(t.n_bytes) for t in GGUFReader(tiny_llama_f32).tensors)
    r = instr("fit", str(tiny_llama_f32), "--memory", f"CPU={weights // 2}", "--format", "json")
    assert r.returncode == 3, r.stderr
    (answer,) = json.loads(r.stdout)
    assert not answer["fits"] and answer["n_ctx"] is None and answer["overflow"] == ["CPU"]
    assert sum(answer["footprint"]["CPU"].values()) > weights // 2
    assert r.stderr.strip() == "error: nothing fits: the smallest setting overflows CPU"


@pytest.mark.parametrize(
    "args, says",
    [
        (["--memory", "CPU"], "DEVICE=SIZE"),
        (["--memory", "CPU=12X"], "not a size"),
        (["--memory", "NoSuchDevice=1G"], "unknown device 'NoSuchDevice'"),
        (["--quant", "q9_z"], "unknown --quant 'q9_z'"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    instr_api: Any, tiny_llama_f32: Path, args: list[str], says: str
) -> None:
    r = instr("fit", str(tiny_llama_f32), *args)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr


def test_run_kv_types(instr_api: Any, tiny_llama_f32: Path, tmp_path: Path) -> None:
    """instr run's -ctk/-ctv: a q8_0 cache holds the bytes ggml's q8_0 blocks say (34 per 32),
    and a quantized V cache with --no-flash-attn is refused in one line (llama.cpp's auto turns
    flash attention on for one)."""
    logs = {}
    for kv in ("f16", "q8_0"):
        logs[kv] = tmp_path / f"{kv}.log"
        r = instr("run", str(tiny_llama_f32), "-p", PROMPT, "-n", "1", "--ctx", "512",
                  "--level", "minimal", "-o", str(logs[kv]), "-ctk", kv, "-ctv", kv,
                  "--flash-attn")  # fmt: skip
        assert r.returncode == 0, r.stderr
    kv_bytes = {
        kv: sum(p.get("kv_cache", 0) for p in live_per_device(log).values())
        for kv, log in logs.items()
    }
    assert kv_bytes["q8_0"] * 2 * 32 == kv_bytes["f16"] * 34
    r = instr("run", str(tiny_llama_f32), "-p", PROMPT, "-n", "1", "-ctv", "q8_0",
              "--no-flash-attn", "-o", str(tmp_path / "refused.log"))  # fmt: skip
    assert r.returncode == 2 and "needs flash attention" in r.stderr, r.stderr
    assert "drop --no-flash-attn" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.vulkan
def test_vulkan_fit_names_the_most_layers_and_one_more_fails(tmp_path: Path) -> None:
    """The same on lavapipe with -ngl (skips without the Vulkan build of the current patches)."""
    from helpers.tiny_gguf import write_tiny_model
    from helpers.vulkan_backend import vulkan_device, vulkan_env

    device = vulkan_device()
    model = write_tiny_model(tmp_path / "tiny.gguf", n_ctx_train=8192, dtype="f32", seed=5)
    check_most_layers_run_and_one_more_fails(
        model, device, VULKAN_LAYERS_BUDGET, ["--device", device], tmp_path, env=vulkan_env()
    )
