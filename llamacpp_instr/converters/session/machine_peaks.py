"""A machine's measured peaks (``instr peaks``), cached per machine, which log they fit, and the
roofs that one session's ops meet (``Roof``).

A peaks file says, for each backend device of the build, the memory bandwidth of a streaming op
(GB/s) and the matmul throughput per weight type (GFLOP/s), as the native probe measured them
(``llama_instr_probe_run``), with the machine they were measured on: the CPU model, the thread
count, and the GPUs. The cache holds one file per machine under ``<cache>/peaks/``; a log's
``session_start.machine`` and ``context.n_threads`` name the file that fits it. Peaks of another
machine are refused, never used. The cache directory is the caller's to give (the command line's
is ``llamacpp_instr.native.paths.cache_dir()``): nothing here decides where it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError

FORMAT = 1


def _gpus(machine: dict[str, Any]) -> list[str]:
    return [
        str(d.get("description") or d.get("name"))
        for d in machine.get("devices", [])
        if d.get("type") in ("gpu", "igpu")
    ]


def machine_key(machine: dict[str, Any], n_threads: int) -> str:
    """What identifies the machine for its peaks: CPU model, threads, GPU names."""
    gpus = _gpus(machine)
    return f"{machine.get('cpu') or 'unknown CPU'}, {n_threads} threads" + (
        f", {' + '.join(gpus)}" if gpus else ", no GPU"
    )


def cache_file(key: str, cache: Path) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")[:60]
    return cache / "peaks" / f"{slug}-{hashlib.sha1(key.encode()).hexdigest()[:8]}.json"


@dataclass(frozen=True)
class DevicePeaks:
    """One device's roofs."""

    name: str  # backend device name: "CPU", "CUDA0"
    type: str  # cpu, gpu, ...
    description: str
    bandwidth_gbs: float  # GB/s (bytes per ns)
    matmul_gflops: dict[str, float]  # by ggml type name, lower case: f32, f16, q4_k, q8_0
    # what a graph costs on the threads beyond its work (ns): a graph of one tiny matmul, its time
    # at the peaks' thread count over its time on one thread (the threads' start and their last
    # meeting, paid once a compute; None: not measured, a file written before it was)
    sync_ns: float | None = None
    # GFLOP/s of a matmul by one column (a generated token's) whose weight, of each type, is far
    # beyond the caches: ggml's kernel for that shape, as a generation step runs it ({}: not
    # measured, a file written before it was)
    gemv_gflops: dict[str, float] = field(default_factory=dict)

    @property
    def compute_gflops(self) -> float:
        """The highest measured compute roof."""
        return max(self.matmul_gflops.values(), default=0.0)

    def compute_roof(self, type_: str | None) -> float:
        """The compute roof of an op on operands of ``type_``: its matmul peak where measured,
        else the highest measured one (an upper bound, so no fraction is overstated)."""
        got = self.matmul_gflops.get((type_ or "f32").lower())
        return got if got else self.compute_gflops


@dataclass(frozen=True)
class Peaks:
    machine: dict[str, Any]  # as session_start's "machine"
    n_threads: int
    date: str  # ISO-8601 UTC, when measured
    devices: list[DevicePeaks]
    measurements: list[dict[str, Any]] = field(default_factory=list)  # the probe's raw results

    @property
    def key(self) -> str:
        return machine_key(self.machine, self.n_threads)

    def device(self, name: str | None = None) -> DevicePeaks:
        """The device called ``name`` (default: the CPU)."""
        for d in self.devices:
            if (name is None and d.type == "cpu") or d.name == name:
                return d
        raise UserError(f"the peaks of {self.key} have no device {name or 'CPU'}")

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "key": self.key,
            "date": self.date,
            "machine": self.machine,
            "n_threads": self.n_threads,
            "devices": [
                {
                    "name": d.name,
                    "type": d.type,
                    "description": d.description,
                    "bandwidth_gbs": d.bandwidth_gbs,
                    "matmul_gflops": d.matmul_gflops,
                    **({} if d.sync_ns is None else {"sync_ns": d.sync_ns}),
                    **({"gemv_gflops": d.gemv_gflops} if d.gemv_gflops else {}),
                }
                for d in self.devices
            ],
            "measurements": self.measurements,
        }


def from_json(doc: Any, where: str) -> Peaks:
    try:
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT}")
        devices = [
            DevicePeaks(
                name=str(d["name"]),
                type=str(d["type"]),
                description=str(d.get("description", "")),
                bandwidth_gbs=float(d["bandwidth_gbs"]),
                matmul_gflops={str(k): float(v) for k, v in d["matmul_gflops"].items()},
                sync_ns=_sync(d.get("sync_ns")),
                gemv_gflops={str(k): float(v) for k, v in d.get("gemv_gflops", {}).items()},
            )
            for d in doc["devices"]
        ]
        return Peaks(
            machine=dict(doc["machine"]),
            n_threads=int(doc["n_threads"]),
            date=str(doc["date"]),
            devices=devices,
            measurements=list(doc.get("measurements", [])),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{where} is not a peaks file of llamacpp-instr ({exc})") from None


def _sync(value: Any) -> float | None:
    """A file's ``sync_ns``: a time of 0 to 1 s, or absent (None)."""
    if value is None:
        return None
    ns = float(value)
    if not 0 <= ns <= 1e9:
        raise ValueError(f"sync_ns {value!r} is not a time of 0 to 1 s")
    return ns


def read(path: Path) -> Peaks:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read peaks from {path}: {exc}") from None
    return from_json(doc, str(path))


def save(peaks: Peaks, cache: Path) -> Path:
    """Write the peaks to their machine's file in ``cache`` (atomically: no half-written file)."""
    path = cache_file(peaks.key, cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(peaks.to_json(), indent=1) + "\n")
    os.replace(tmp, path)
    return path


def cached(machine: dict[str, Any], n_threads: int, cache: Path) -> Peaks | None:
    """The peaks of this machine and thread count in ``cache``, if measured; refused (None) if the
    file there names another machine."""
    key = machine_key(machine, n_threads)
    path = cache_file(key, cache)
    if not path.is_file():
        return None
    try:
        p = read(path)
    except UserError:
        return None
    return p if p.key == key else None


def check_fits(peaks: Peaks, machine: dict[str, Any], n_threads: int, where: str) -> None:
    """Refuse peaks measured on another machine (or with another thread count)."""
    key = machine_key(machine, n_threads)
    if peaks.key != key:
        raise UserError(f"{where} were measured on {peaks.key}; the log was made on {key}")


def session_machine(info: Any) -> tuple[dict[str, Any] | None, int]:
    """The machine and CPU thread count of a session (None if the log does not name it)."""
    machine = getattr(info, "machine", None) or None
    n_threads = int((info.context or {}).get("n_threads") or 0)
    return machine, n_threads


def for_session(info: Any, cache: Path) -> tuple[Peaks | None, str]:
    """The peaks in ``cache`` for the machine that made the log, and a note when there are none."""
    machine, n_threads = session_machine(info)
    if not machine or not n_threads:
        return None, "the log does not name its machine (recorded before machine identity)"
    p = cached(machine, n_threads, cache)
    if p is None:
        # the RPC servers of the run, so the peaks' machine is the log's (a description: endpoint)
        devs = machine.get("devices", [])
        rpc = [str(d.get("description")) for d in devs if d.get("backend") == "RPC"]
        with_rpc = f" --rpc {','.join(rpc)}" if rpc else ""
        return None, (
            f"no peaks measured for {machine_key(machine, n_threads)}: "
            f"run `instr peaks --threads {n_threads}{with_rpc}` on it"
        )
    return p, ""


def for_file(path: Path, info: Any) -> Peaks:
    """Peaks from a file, refused unless measured on the machine that made the log."""
    return fitting(read(path), info, f"the peaks in {path}")


def fitting(p: Peaks, info: Any, where: str) -> Peaks:
    """``p``, refused unless measured on the machine that made the log of ``info``."""
    machine, n_threads = session_machine(info)
    if not machine:
        raise UserError(f"the log does not name its machine: {where} cannot be checked")
    check_fits(p, machine, n_threads, where)
    return p


# --- the roofs a session's ops meet (``roofline.py`` over frames, the trace writers per op) ---

MATMULS = ("MUL_MAT", "MUL_MAT_ID")


def kv_type(info: Any) -> str:
    """The KV cache's type of a session (what a matmul without a weight reads)."""
    return str((info.context or {}).get("type_k") or "f16")


@dataclass(frozen=True)
class Roof:
    """The roofs one session's ops meet: its device's peaks, and the KV cache's type."""

    device: DevicePeaks
    kv_type: str

    def compute(self, op: str, weight_type: str | None) -> float:
        """An op's compute roof (GFLOP/s): a matmul's weight type's peak (a KV cache read: the
        cache's type), the F32 matmul peak for the rest."""
        if op in MATMULS:
            return self.device.compute_roof(weight_type or self.kv_type)
        return self.device.compute_roof("f32")

    def ideal(
        self, n_flops: int, n_bytes: int, op: str, weight_type: str | None
    ) -> tuple[float, str]:
        """The least time (ns) of an op at the roofs, and the roof that binds it (what
        ``op_columns`` gives a frame's ops, for one op: the trace writers' args)."""
        bw = self.device.bandwidth_gbs
        compute = self.compute(op, weight_type)
        mem = n_bytes / bw if bw > 0 else 0.0
        comp = n_flops / compute if compute > 0 else 0.0
        return max(mem, comp), "compute" if comp > mem else "memory"


def session_roofs(
    peaks_file: Path | None = None, cache: Path | None = None
) -> Callable[[Any], Roof | None]:
    """What gives each session of a log its roofs: the peaks in ``peaks_file`` (refused, with a
    one-line error, for a session made on another machine), else the peaks in ``cache`` of the
    machine that made it (None where there are none, or no ``cache``)."""

    # a bad file is refused here, before any session is read
    given = read(peaks_file) if peaks_file is not None else None

    def find(info: Any) -> Roof | None:
        if given is not None:
            p: Peaks | None = fitting(given, info, f"the peaks in {peaks_file}")
        else:
            p = for_session(info, cache)[0] if cache is not None else None
        return Roof(p.device(), kv_type(info)) if p is not None else None

    return find
