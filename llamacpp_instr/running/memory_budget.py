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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.contract.units import fmt_bytes
from llamacpp_instr.converters.session.memory_timeline import failure_line
from llamacpp_instr.running import context_choices
from llamacpp_instr.running.always_on import parse_size

ENV_VAR = "LLAMA_INSTR_MEMORY_BUDGET"

_DEVICE = re.compile(r"^[A-Za-z][A-Za-z0-9_.:\[\]-]*$")

# llama.cpp's -ctk/-ctv types, as the options list them (context_choices: the one list)
KV_TYPES = context_choices.KV_TYPES

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
    return [f"{what} (frees about {fmt_bytes(saved)})" for saved, what in out if saved > 0]


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


@dataclass(frozen=True)
class LogMark:
    """Where a log stood before a program began to write to it: the file (its inode) and size."""

    inode: int | None
    size: int
    time_ns: int


def mark_log(path: Path) -> LogMark:
    try:
        st = path.stat()
    except OSError:
        return LogMark(None, 0, time.time_ns())
    return LogMark(st.st_ino, st.st_size, time.time_ns())


def failure_in_log(path: Path, since: LogMark) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The last ``memory_alloc_failed`` a program wrote to the log at ``path`` after ``since``
    (its fields, as ``lib.memory_failure()`` gives them), with its session's ``context`` (empty if
    the session said none); None when it wrote none. Every file of a rotated log written since is
    read (the failure may have been rotated out of the file at ``path``)."""
    from llamacpp_instr.converters.reading.decode.memory import failure
    from llamacpp_instr.converters.reading.reader import BadLine, log_files, open_log, parse_line

    try:
        files = log_files(path)
    except UserError:
        return None
    found: tuple[dict[str, Any], dict[str, Any]] | None = None
    context: dict[str, Any] = {}
    for f in files:
        try:
            st = f.stat()
            if st.st_ino == since.inode:
                start = since.size
            elif st.st_mtime_ns >= since.time_ns:
                start = 0  # a file made since (rotated, or the log replaced)
            else:
                continue
            with open_log(f) as fh:
                fh.seek(start)
                for line in fh:
                    if b'"session_start"' not in line and b'"memory_alloc_failed"' not in line:
                        continue
                    try:
                        rec, _ = parse_line(line, line.endswith(b"\n"))
                    except BadLine:
                        continue
                    if rec["type"] == "session_start" and isinstance(rec.get("context"), dict):
                        context = rec["context"]
                    elif rec["type"] == "memory_alloc_failed":
                        found = (failure(rec), context)
        except (OSError, EOFError, KeyError, TypeError, ValueError):
            continue  # a file gone or damaged: the others may still say
    return found


# llama.cpp's own flags for what the message weighs (common/arg.cpp; llama-bench's are the same
# for these, with comma-separated lists of values)
_PROGRAM_FLAGS = {
    "n_ctx": ("-c", "--ctx-size"),
    "n_ubatch": ("-ub", "--ubatch-size"),
    "gpu_layers": ("-ngl", "--gpu-layers", "--n-gpu-layers"),
    "type_k": ("-ctk", "--cache-type-k"),
    "type_v": ("-ctv", "--cache-type-v"),
    "model": ("-m", "--model"),
}


def _flag(args: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the last of ``names`` in ``args`` (``-c 512`` or ``--ctx-size=512``)."""
    value = None
    for i, a in enumerate(args):
        if a in names and i + 1 < len(args):
            value = args[i + 1]
        elif "=" in a and a.split("=", 1)[0] in names:
            value = a.split("=", 1)[1]
    return value


def program_setting(program: str, args: list[str], context: dict[str, Any]) -> Setting:
    """What one of llama.cpp's programs asked of memory: its own flags, else what its session
    said of its context. A llama-bench value given as a list (one per test) is not known to be the
    failed test's, and llama-bench has no -c (its context is -p + -n): those are left out."""
    bench = program == "llama-bench"

    def value(key: str, cast: type, default: Any) -> Any:
        given = _flag(args, _PROGRAM_FLAGS[key])
        if given is not None:
            if "," in given:
                return default
            try:
                return cast(given)
            except ValueError:
                return default
        if bench:  # its session's context is its first test's
            return default
        got = context.get(key)
        return cast(got) if isinstance(got, (int, str)) and not isinstance(got, bool) else default

    n_ctx = 0 if bench else value("n_ctx", int, 0)
    ngl = value("gpu_layers", int, None)
    model = _flag(args, _PROGRAM_FLAGS["model"])
    n_layer, q4k_saving = model_facts(model) if model else (None, 0.0)
    return Setting(
        n_ctx=n_ctx,
        n_ubatch=value("n_ubatch", int, 512),
        gpu_layers=ngl if ngl is not None and ngl >= 0 else None,
        n_layer=n_layer,
        type_k=value("type_k", str, "f16"),
        type_v=value("type_v", str, "f16"),
        q4k_saving=q4k_saving,
    )
