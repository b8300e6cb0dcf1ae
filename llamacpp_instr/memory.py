"""Device memory for the commands: the memory budget option, and the one line that says why a
run did not fit and what would free how much.

The budget (``--memory-budget DEVICE=SIZE[,...]``, or ``LLAMA_INSTR_MEMORY_BUDGET``) makes a
device behave as if it had only that much memory: the native side fails an allocation beyond it
as a device out of memory does, and lowers what ggml's memory query reports, so llama.cpp's own
fitting sees it too. The failure itself is measured natively (``memory_alloc_failed``: the
device, the purpose and bytes asked, the bytes free and what each purpose held there); the
savings this module suggests are worked out from those measured bytes and the setting, and are
labelled as what they are ("about").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from llamacpp_instr.always_on import parse_size
from llamacpp_instr.converters.errors import UserError
from llamacpp_instr.converters.session.memory import failure_line, size

ENV_VAR = "LLAMA_INSTR_MEMORY_BUDGET"

_DEVICE = re.compile(r"^[A-Za-z][A-Za-z0-9_.:\[\]-]*$")

# llama.cpp's -ctk/-ctv types (common/arg.cpp kv_cache_types), by ggml's names
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

# bytes per element of the KV cache types llama.cpp's -ctk/-ctv take (ggml's block sizes)
_KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


class OutOfMemory(UserError):
    """A run that did not fit: one line (``message``), exit status 3 (bad input is 2)."""

    exit_status = 3


def parse_budget(spec: str) -> dict[str, int]:
    """'CPU=2G,Vulkan0=512M' -> {'CPU': ..., 'Vulkan0': ...}; a UserError if malformed. Whether
    each device exists is checked by the patched library when the budget is applied."""
    out: dict[str, int] = {}
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        device, eq, size = item.partition("=")
        if not eq or not _DEVICE.match(device.strip()):
            raise UserError(f"a memory budget is DEVICE=SIZE[,DEVICE=SIZE...], not {item!r}")
        out[device.strip()] = parse_size(size)
    if not out:
        raise UserError("the memory budget is empty (DEVICE=SIZE[,DEVICE=SIZE...])")
    return out


def format_budget(budget: dict[str, int]) -> str:
    """The spec the native side reads, in bytes."""
    return ",".join(f"{device}={size}" for device, size in budget.items())


@dataclass(frozen=True)
class Setting:
    """What the failed run asked for: the knobs whose savings the message weighs."""

    n_ctx: int
    n_ubatch: int
    gpu_layers: int | None = None  # layers offloaded (None: unknown or all)
    n_layer: int | None = None
    type_k: str = "f16"
    type_v: str = "f16"
    # the share of the weights' bytes a Q4_K quantization would save (model_facts)
    q4k_saving: float = 0.0
    # the command's own flags for the context size and the ubatch (llama.cpp's by default)
    ctx_flag: str = "-c"
    ubatch_flag: str = "-ub"


def suggestions(failure: dict[str, Any], setting: Setting) -> list[str]:
    """What would free how much on the failed device, largest first: a smaller -c, a quantized KV
    cache, fewer -ngl (not on the CPU), a smaller -ub, a smaller quantization of the weights."""
    held = {k: int(v) for k, v in (failure.get("held") or {}).items()}
    purpose = str(failure.get("purpose", "other"))
    asked = int(failure.get("bytes", 0))
    # what each purpose would hold had the allocation succeeded
    want = dict(held)
    want[purpose] = want.get(purpose, 0) + asked
    short = max(0, asked - int(failure.get("free", 0)))
    out: list[tuple[int, str]] = []

    kv = want.get("kv_cache", 0)
    if kv > 0 and setting.n_ctx > 256:
        per_cell = kv / setting.n_ctx
        # the largest -c (a multiple of 256, as llama.cpp pads the cache) that frees the shortfall
        cells = int((kv - short) / per_cell) // 256 * 256 if short else setting.n_ctx // 2
        cells = max(256, min(cells, setting.n_ctx // 2 if not short else cells))
        if cells < setting.n_ctx:
            out.append((int(per_cell * (setting.n_ctx - cells)), f"{setting.ctx_flag} {cells}"))
    now = (_KV_TYPE_BYTES.get(setting.type_k, 2.0) + _KV_TYPE_BYTES.get(setting.type_v, 2.0)) / 2
    if kv > 0 and now > _KV_TYPE_BYTES["q8_0"]:
        saved = int(kv * (1 - _KV_TYPE_BYTES["q8_0"] / now))
        out.append((saved, "a q8_0 KV cache (-ctk q8_0 -ctv q8_0)"))
    weights = want.get("weights", 0)
    on_gpu = failure.get("device_name", "CPU") != "CPU"
    if on_gpu and weights > 0 and setting.gpu_layers and setting.n_layer:
        layers = min(setting.gpu_layers, setting.n_layer)
        per_layer = weights / max(1, layers)
        drop = max(1, -(-short // int(per_layer))) if short and per_layer else 1
        if drop < layers:
            out.append((int(per_layer * drop), f"-ngl {layers - drop}"))
    compute = want.get("compute", 0)
    if compute > 0 and setting.n_ubatch > 64:
        out.append((compute // 2, f"{setting.ubatch_flag} {setting.n_ubatch // 2}"))
    if weights > 0 and setting.q4k_saving > 0:
        out.append((int(weights * setting.q4k_saving), "the weights quantized to Q4_K"))
    out.sort(key=lambda x: -x[0])
    return [f"{what} (frees about {size(saved)})" for saved, what in out if saved > 0]


def message(failure: dict[str, Any], setting: Setting | None = None) -> str:
    """One line: what failed, where, what was free and held there (the summary's own line), and
    what would free how much."""
    line = failure_line(failure)
    tips = suggestions(failure, setting) if setting else []
    if tips:
        line += "; would free: " + "; ".join(tips)
    return line


def model_facts(path: str) -> tuple[int | None, float]:
    """From the model's GGUF: its block count, and the share of its weights' bytes that Q4_K
    (4.5 bits per weight) would save, counting each matrix whose type takes more bits and whose
    rows are whole Q4_K blocks; (None, 0.0) if the file can't be read."""
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

        reader = GGUFReader(path)
        arch = reader.fields["general.architecture"]
        name = bytes(arch.parts[arch.data[0]]).decode()
        field = reader.fields.get(f"{name}.block_count")
        n_layer = int(field.parts[field.data[0]][0]) if field is not None else None
        q4k_block, q4k_bytes = GGML_QUANT_SIZES[GGMLQuantizationType.Q4_K]
        total = saved = 0
        for t in reader.tensors:
            total += int(t.n_bytes)
            if len(t.shape) < 2 or int(t.shape[0]) % q4k_block:
                continue
            as_q4k = int(t.n_elements) // q4k_block * q4k_bytes
            saved += max(0, int(t.n_bytes) - as_q4k)
        return n_layer, (saved / total if total else 0.0)
    except Exception:  # noqa: BLE001 - the message is still useful without them
        return None, 0.0


def explain(lib: Any, before: dict[str, Any] | None, setting: Setting | None) -> OutOfMemory | None:
    """An OutOfMemory for the allocation that failed since ``before`` (``lib.memory_failure()``
    taken before the work began), or None when none did."""
    failure = lib.memory_failure()
    if failure is None or failure == before:
        return None
    return OutOfMemory(message(failure, setting))
