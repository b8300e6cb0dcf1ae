"""The weight inventory of a model: per tensor its role, layer, type, bytes and bits per weight,
grouped per layer, role and type, compared between models (what ``instr quant-report`` shows;
``render`` makes the report), and each tensor's dequantization error against a reference.

Bytes and bits per weight come from gguf-py: a GGUF file's tensors as ``GGUFReader`` reads them
(``n_bytes`` computed from ``GGML_QUANT_SIZES``), or a session log's weight inventory (bytes as the
native side measured them). A type id the installed gguf-py does not know is reported as
``unknown(<id>)``, never a crash.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llamacpp_instr.contract.errors import UserError

from ...reading.decode.sessions import SessionInfo

_BLK = re.compile(r"^blk\.(\d+)\.(.+?)(\.weight|\.bias)?$")


@dataclass
class TensorRow:
    name: str
    role: str
    layer: int | None
    type: str
    type_id: int
    shape: list[int]
    n_elements: int
    bytes: int

    @property
    def bpw(self) -> float:
        return self.bytes * 8 / self.n_elements if self.n_elements else 0.0


@dataclass
class Inventory:
    """One model's weights."""

    label: str
    source: str
    file_type: str
    tensors: list[TensorRow]
    memory: dict[str, Any] | None = None  # from a session: weights / KV cache / compute, per buffer

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.tensors)

    @property
    def n_elements(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def bpw(self) -> float:
        return self.bytes * 8 / self.n_elements if self.n_elements else 0.0


def role_of(name: str) -> tuple[str, int | None]:
    """``blk.3.attn_q.weight`` -> (``attn_q``, 3); ``token_embd.weight`` -> (``token_embd``, None)."""
    m = _BLK.match(name)
    if m:
        return m.group(2) + ("_bias" if m.group(3) == ".bias" else ""), int(m.group(1))
    base = name.removesuffix(".weight")
    return (base[:-5] + "_bias" if base.endswith(".bias") else base), None


def type_name(type_id: int) -> str:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(type_id).name.lower()
    except ValueError:
        return f"unknown({type_id})"


def from_gguf(path: Path | str) -> Inventory:
    """A GGUF file's weight inventory, read with gguf-py."""
    from gguf import GGUFReader

    p = Path(path)
    if not p.is_file():
        raise UserError(f"model file not found: {p}")
    with p.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise UserError(f"not a GGUF file: {p}")
    try:
        reader = GGUFReader(p)
    except ValueError as exc:
        # gguf-py refuses a whole file over one tensor type it does not know (e.g. a type newer
        # llama.cpp writes): read the tensor table ourselves and report that tensor as unknown
        try:
            return _from_raw_header(p)
        except (ValueError, IndexError, KeyError, struct.error):
            raise UserError(f"gguf-py cannot read {p} (truncated or corrupt?): {exc}") from None
    except Exception as exc:  # noqa: BLE001 - gguf-py raises many kinds on damaged files
        raise UserError(
            f"gguf-py cannot read {p} (truncated or corrupt?): {type(exc).__name__}: {exc}"
        ) from None
    size = p.stat().st_size
    rows = []
    for t in reader.tensors:
        if int(t.data_offset) + int(t.n_bytes) > size:
            raise UserError(f"truncated GGUF: tensor {t.name} ends past the end of {p}")
        role, layer = role_of(t.name)
        shape = [int(d) for d in t.shape]
        while len(shape) > 1 and shape[-1] == 1:
            shape.pop()
        rows.append(
            TensorRow(
                name=t.name,
                role=role,
                layer=layer,
                type=type_name(int(t.tensor_type)),
                type_id=int(t.tensor_type),
                shape=shape,
                n_elements=int(t.n_elements),
                bytes=int(t.n_bytes),
            )
        )
    ft = reader.fields.get("general.file_type")
    file_type = str(int(ft.parts[ft.data[0]][0])) if ft is not None else "?"
    try:
        from gguf import LlamaFileType

        file_type = LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (ValueError, ImportError):
        pass
    return Inventory(label=p.stem, source=str(p), file_type=file_type, tensors=rows)


# the GGUF metadata value types read as one struct item, each with its format
_SCALAR = dict(zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIif?Qqd", strict=True))


class _Cursor:
    """Little-endian items of a GGUF's header, read from ``pos`` on."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data, self.pos = data, pos

    def take(self, fmt: str) -> Any:
        vals = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return vals[0]

    def string(self) -> str:
        n = self.take("Q")
        text = self.data[self.pos : self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, vtype: int) -> Any:
        """A metadata value of type ``vtype``: a string, an array or a scalar."""
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, n = self.take("I"), self.take("Q")
            return [self.value(etype) for _ in range(n)]
        if vtype not in _SCALAR:
            raise ValueError(f"unknown metadata value type {vtype}")
        return self.take(_SCALAR[vtype])


def _raw_header(data: bytes) -> tuple[dict[str, Any], list[tuple[str, list[int], int, int]], int]:
    """A GGUF's (v2/v3) metadata, its tensor infos (name, dims, type id, data offset) and where
    its tensor data starts."""
    if data[:4] != b"GGUF":
        raise ValueError("not a GGUF")
    c = _Cursor(data, 4)
    c.take("I")  # version
    n_tensors, n_kv = c.take("Q"), c.take("Q")
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string()
        kv[key] = c.value(c.take("I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        dims = [c.take("Q") for _ in range(c.take("I"))]
        tid = c.take("I")
        infos.append((name, dims, tid, c.take("Q")))
    align = int(kv.get("general.alignment", 32))
    return kv, infos, (c.pos + align - 1) // align * align


def _from_raw_header(p: Path) -> Inventory:
    """The tensor table of a GGUF (v2/v3) read directly; bytes of known types from gguf-py's
    table, of unknown types from the distance to the next tensor's data (what the file holds)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    data = p.read_bytes()
    kv, infos, data_start = _raw_header(data)
    offsets = sorted(off for _, _, _, off in infos)
    next_off = dict(zip(offsets, offsets[1:] + [len(data) - data_start], strict=True))
    rows = []
    for name, dims, tid, off in infos:
        n_el = 1
        for d in dims:
            n_el *= int(d)
        try:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(tid)]
            nbytes = n_el // block * size
        except ValueError:
            nbytes = next_off[off] - off  # unknown to gguf-py: what the file holds for it
        if data_start + off + nbytes > len(data):
            raise UserError(f"truncated GGUF: tensor {name} ends past the end of {p}")
        role, layer = role_of(name)
        rows.append(
            TensorRow(name, role, layer, type_name(tid), tid, [int(d) for d in dims], n_el, nbytes)
        )
    file_type = str(kv.get("general.file_type", "?"))
    return Inventory(label=p.stem, source=str(p), file_type=file_type, tensors=rows)


def from_session(path: Path | str) -> Inventory:
    """The weight inventory and memory breakdown recorded in a session log's (first) session_start,
    as the decoder reads it (``decode.sessions.session_info``)."""
    from ...reading.decode.sessions import SessionStarted
    from ...session.fold import iter_events

    for ev in iter_events(path):
        if isinstance(ev, SessionStarted):
            return _session_inventory(ev.session, path)
    raise UserError(f"{path}: no session_start record, so no weight inventory")


def _session_inventory(info: SessionInfo, path: Path | str) -> Inventory:
    if not info.weights:
        raise UserError(
            f"{path}: the session has no weight inventory (session begun without a context)"
        )
    rows = []
    # a model's tensor once: a tensor llama.cpp uses twice (tied embeddings as the output) is
    # listed twice where its second use lives in another buffer (a repacked copy), but the
    # model holds it once
    named: set[str] = set()
    for w in info.weights:
        if str(w["name"]) in named:
            continue
        named.add(str(w["name"]))
        role, layer = role_of(str(w["name"]))
        tid = int(w.get("type_id", -1))
        rows.append(
            TensorRow(
                name=str(w["name"]),
                role=role,
                layer=layer,
                type=type_name(tid) if tid >= 0 else str(w["type"]),
                type_id=tid,
                shape=[int(d) for d in w["shape"]],
                n_elements=int(w["n_elements"]),
                bytes=int(w["bytes"]),
            )
        )
    label = str(info.model.get("name") or Path(path).stem)
    file_type = str(info.model.get("file_type", "?"))
    return Inventory(label, str(path), file_type, rows, info.memory or None)


def group(inv: Inventory, key: str) -> list[dict[str, Any]]:
    """Bytes, elements, shares and bits per weight per ``layer``, ``role`` or ``type``."""
    acc: dict[Any, list[int]] = {}
    for t in inv.tensors:
        k = getattr(t, key)
        a = acc.setdefault("none" if k is None else k, [0, 0, 0])
        a[0] += t.bytes
        a[1] += t.n_elements
        a[2] += 1
    total_b, total_e = inv.bytes or 1, inv.n_elements or 1
    rows = [
        {
            key: k,
            "tensors": n,
            "bytes": b,
            "elements": e,
            "byte_share": b / total_b,
            "element_share": e / total_e,
            "bpw": b * 8 / e if e else 0.0,
        }
        for k, (b, e, n) in acc.items()
    ]
    if key == "layer":
        return sorted(
            rows, key=lambda r: (r["layer"] == "none", r["layer"] if r["layer"] != "none" else 0)
        )
    return sorted(rows, key=lambda r: -r["bytes"])


def tensor_rows(inv: Inventory) -> list[dict[str, Any]]:
    """One row per tensor, largest first. Compression is given against F32 (``vs_f32``) and against
    16 bits per weight (``vs_16bit``): F16 and BF16 are both 16-bit, so one ratio serves both."""
    return [
        {
            "name": t.name,
            "role": t.role,
            "layer": t.layer,
            "type": t.type,
            "shape": "x".join(map(str, t.shape)),
            "elements": t.n_elements,
            "bytes": t.bytes,
            "bpw": t.bpw,
            "vs_f32": t.n_elements * 4 / t.bytes if t.bytes else 0.0,
            "vs_16bit": t.n_elements * 2 / t.bytes if t.bytes else 0.0,
        }
        for t in sorted(inv.tensors, key=lambda t: -t.bytes)
    ]


def totals(inv: Inventory) -> dict[str, Any]:
    return {
        "model": inv.label,
        "source": inv.source,
        "file_type": inv.file_type,
        "tensors": len(inv.tensors),
        "bytes": inv.bytes,
        "elements": inv.n_elements,
        "bpw": inv.bpw,
        "vs_f32": inv.n_elements * 4 / inv.bytes if inv.bytes else 0.0,
        "vs_16bit": inv.n_elements * 2 / inv.bytes if inv.bytes else 0.0,
    }


def compare(models: list[Inventory]) -> dict[str, Any]:
    """Side by side against the first model: per tensor, layer and role, and type changes."""
    base = models[0]
    out: dict[str, Any] = {"baseline": base.label, "others": []}
    by_name = {t.name: t for t in base.tensors}
    for other in models[1:]:
        common = [t for t in other.tensors if t.name in by_name]
        missing = sorted(set(by_name) - {t.name for t in other.tensors})
        extra = sorted({t.name for t in other.tensors} - set(by_name))
        per_tensor = [
            {
                "name": t.name,
                "type_a": by_name[t.name].type,
                "type_b": t.type,
                "bytes_a": by_name[t.name].bytes,
                "bytes_b": t.bytes,
                "saved": by_name[t.name].bytes - t.bytes,
                "ratio": by_name[t.name].bytes / t.bytes if t.bytes else 0.0,
            }
            for t in common
        ]

        def agg(key: str, other: Inventory = other) -> list[dict[str, Any]]:
            a = {r[key]: r for r in group(base, key)}
            b = {r[key]: r for r in group(other, key)}
            return [
                {key: k, "bytes_a": a[k]["bytes"], "bytes_b": b[k]["bytes"], "saved": a[k]["bytes"] - b[k]["bytes"],
                 "bpw_a": a[k]["bpw"], "bpw_b": b[k]["bpw"]}  # fmt: skip
                for k in a
                if k in b
            ]

        out["others"].append(
            {
                "model": other.label,
                "bytes_a": base.bytes,
                "bytes_b": other.bytes,
                "saved": base.bytes - other.bytes,
                "ratio": base.bytes / other.bytes if other.bytes else 0.0,
                "type_changes": [r for r in per_tensor if r["type_a"] != r["type_b"]],
                "per_tensor": per_tensor,
                "per_layer": agg("layer"),
                "per_role": agg("role"),
                "only_in_baseline": missing,
                "only_in_other": extra,
            }
        )
    return out


def dequant_error(model: Path | str, reference: Path | str) -> list[dict[str, Any]]:
    """Per-tensor error of ``model``'s weights against ``reference``'s (RMSE, max abs, SNR dB)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    a = {t.name: t for t in GGUFReader(model).tensors}
    rows = []
    for rt in GGUFReader(reference).tensors:
        t = a.get(rt.name)
        if t is None:
            continue
        row: dict[str, Any] = {
            "name": rt.name,
            "type": type_name(int(t.tensor_type)),
            "ref_type": type_name(int(rt.tensor_type)),
        }
        try:
            x = dequantize(t.data, t.tensor_type).astype(np.float64).ravel()
            r = dequantize(rt.data, rt.tensor_type).astype(np.float64).ravel()
        except (NotImplementedError, ValueError, KeyError):
            row.update({"rmse": "n/a", "max_abs": "n/a", "snr_db": "n/a"})
            rows.append(row)
            continue
        err = x - r
        rmse = float(np.sqrt(np.mean(err**2)))
        sig = float(np.mean(r**2))
        row.update(
            {
                "rmse": rmse,
                "max_abs": float(np.max(np.abs(err))) if err.size else 0.0,
                "rel_rmse": rmse / np.sqrt(sig) if sig > 0 else 0.0,
                "snr_db": float(10 * np.log10(sig / max(rmse**2, 1e-30))) if sig > 0 else 0.0,
            }
        )
        rows.append(row)
    return rows


def report_data(
    models: list[Inventory], error: list[tuple[str, list[dict[str, Any]]]] | None = None
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "models": [
            {
                "totals": totals(m),
                "per_type": group(m, "type"),
                "per_role": group(m, "role"),
                "per_layer": group(m, "layer"),
                "tensors": tensor_rows(m),
                "memory": m.memory,
            }
            for m in models
        ]
    }
    if len(models) > 1:
        data["comparison"] = compare(models)
    if error is not None:
        data["error_vs_reference"] = error
    return data
