"""Attention at a depth no log ran, measured: the native probe (``llama_instr_probe_run``, kind
ATTENTION) runs the target's own attention ops on this machine's backend at the target's
depth, and the logs keep their say on everything else.

A log of a short prompt measured attention over a few hundred KV cells at most, where a
kernel's fixed costs dominate; a line through those times carried to thousands of cells was off
by a third and more, and differently on each CPU (its per-cell cost is the kernel's inner loop
over cached rows, not a cost the short log can show). So where a compute reads more cells than
the logs' computes did, each of its attention ops (flash attention, or KQ, its softmax and
KQV) is priced as

    the model's price of the op at the most cells the logs read  (``anchor``)
    + probe(the op at the target's cells) - probe(the op at the anchor's cells)

(flash attention's anchor: the ubatch at a position where its rows see no more cells than the
logs' computes did, for its time is in the cells its rows see, not the cache's)

the probe building the op as llama.cpp's graph does (the caches' views, the causal mask, the
query rows at their positions), once per layer in one graph, each layer reading a cache of its
own, at the target's thread count on the op's device. Its layers hold as many bytes as a
token of the target reads (its weights and every layer's caches, ``Probe.span``), up to
``PROBE_BYTES``, not the model's count of layers: where the model's working set is more than a
last-level cache holds, the weights pass between two reads of a layer's cache and it is read
cold, and the probe's caches, more than that cache holds, are read cold too; where the working
set fits, the run reads its caches warm and so does the probe (a 2-layer model's KV matmuls at
3,072 cells took 2.5x as long in a probe over 256 MiB as in its run on a 32 MiB L3, and the
same within 1.3x in a probe over its own 4 MiB). The median of ``PROBE_RUNS`` computes keeps a
short probe's backend start-up out of what is timed. What the logs
measured stays theirs; what they could not show, the kernel's growth with the cells, is
measured at the depth asked.

The probe measures this machine: it is used only where this machine is the logs' (the CPU model
and the device names as ``session_start.machine`` records them) and the op's device is one it
can run (not an RPC server's); elsewhere the line per cell prices the op (``kv_costs``), bounded
by ``kv_costs.KV_EXTRAPOLATION``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from llamacpp_instr.converters.analysis.probe_shapes import FLASH, KQ, KQV, SOFTMAX, Shape

# the bytes of caches one probe's layers hold (at most 512 layers): beyond a last-level cache
PROBE_BYTES = 256 << 20
# computes the probe times, of which their median counts: a shared machine's bursts fall on some
# of them (a 2-core VM, two other processes spinning 50-300 ms on and off: a flash-attention token
# at 3,000 cells was priced 16.8-34.2 tok/s from the best of two, 30.5-36.5 from the best of six),
# and its fastest is a moment a run is not priced by: on a 2-core VM whose speed moves by a
# quarter from one moment to the next, single computes of one flash-attention shape spread by 18 %
# (1,831-2,157 us a layer; their best 1,792)
PROBE_RUNS = 6

# llama_instr_probe_attn_op
OPS = {FLASH: 0, KQ: 1, SOFTMAX: 2, KQV: 3}
# ggml's type ids of the caches' types (gguf's GGMLQuantizationType)
_F16 = 1


def _type_id(name: str) -> int:
    import gguf

    try:
        return int(gguf.GGMLQuantizationType[name.upper()].value)
    except KeyError:
        return _F16


class Probe:
    """The native attention probe on this process's devices, at ``threads`` (the CPU's), for
    caches of ``kv_size`` cells; each measurement cached. ``failed`` says why one could not be
    made (the op is then priced by its line)."""

    def __init__(
        self,
        lib: Any,
        devices: dict[str, int],
        threads: int,
        kv_size: int,
        weights: int | None = None,
        n_layer: int = 0,
    ) -> None:
        self.lib = lib
        self.devices = devices  # ggml device name -> index
        self.threads = threads
        self.kv_size = kv_size
        # the target's weights' bytes and its layers (None: a model larger than PROBE_BYTES)
        self.weights = weights
        self.n_layer = n_layer
        self.cache: dict[tuple[Shape, int, str, int], float | None] = {}
        self.failed: dict[str, None] = {}
        self.runs = 0

    def span(self, shape: Shape) -> int:
        """The bytes a token of the target reads, its weights and all its layers' K and V caches
        (at ``shape``'s heads, F16), up to ``PROBE_BYTES``: what the probe's caches hold."""
        if self.weights is None:
            return PROBE_BYTES
        kv = replace(shape, op=FLASH).cache_bytes(self.kv_size)  # a layer's K and V caches
        return max(1, min(self.weights + self.n_layer * kv, PROBE_BYTES))

    def ns(self, shape: Shape, pos0: int, device: str) -> float | None:
        """One layer's time (ns) of ``shape``'s op with its first query row at ``pos0``, on
        ``device``, measured over the layers of ``span`` bytes of caches; None where it cannot
        be."""
        from llamacpp_instr.native import bindings

        index = self.devices.get(device)
        if index is None:
            self.failed[f"{device}: the probe cannot run there"] = None
            return None
        per = max(shape.cache_bytes(self.kv_size), 1)
        layers = max(1, min(math.ceil(self.span(shape) / per), 512))
        pos0 = max(0, min(pos0, shape.n_kv - shape.rows))
        key = (shape, pos0, device, layers)
        if key in self.cache:
            return self.cache[key]
        attn = bindings.ProbeAttn(
            op=OPS[shape.op], type_k=_type_id(shape.type_k), type_v=_type_id(shape.type_v),
            head_dim_k=shape.head_dim_k, head_dim_v=shape.head_dim_v, n_head=shape.n_head,
            n_head_kv=shape.n_head_kv, n_layer=layers, kv_size=max(self.kv_size, shape.n_kv),
            n_kv=shape.n_kv, pos0=pos0,
        )  # fmt: skip
        try:
            p = self.lib.probe(
                bindings.PROBE_ATTENTION, index, 0, self.threads, 0, shape.rows, PROBE_RUNS, attn
            )
            got: float | None = p.median_ns / layers
            self.runs += 1
        except bindings.SessionError as exc:
            self.failed[f"{shape.op} on {device}: {exc}"] = None
            got = None
        self.cache[key] = got
        return got


def same_machine(lib: Any, logged: list[dict[str, Any] | None]) -> bool:
    """Whether this process's machine is the one every log names (its CPU model and count, and
    each device the logs ran on other than an RPC server's), so that what the probe measures
    here is what the logs ran on."""
    here = lib.machine_info()
    names = {str(d.get("name")) for d in here.get("devices", [])}
    for m in logged:
        if not m or m.get("cpu") != here.get("cpu") or m.get("n_cpus") != here.get("n_cpus"):
            return False
        theirs = {str(d.get("name")) for d in m.get("devices", []) if d.get("backend") != "RPC"}
        if not theirs <= names:
            return False
    return True


def this_machine(logged: list[dict[str, Any] | None]) -> tuple[Any, list[dict[str, Any]]] | None:
    """The loaded library and this machine's devices (``machine_info``), where this machine is the
    one every log names (``same_machine``); None elsewhere: a probe here would not measure what
    the logs ran on."""
    from llamacpp_instr.native import bindings

    lib = bindings.load()
    if not same_machine(lib, logged):
        return None
    return lib, list(lib.machine_info().get("devices", []))
