"""A generated token's matmuls at a thread count no log ran, measured: the native probe (kind
MATMUL, one column) runs weights of each op's own shape and type on this machine's CPU, at the
logs' thread count and at the target's in turns, and the op moves by what it measured.

One large one-column matmul (``instr peaks``' ``gemv``, a weight of 96 MiB) does not move as a
model's do: a model reads many weights of a few MiB each, one op after another, each op's
threads starting and meeting again, all of them beyond the caches. On a 2-core VM, in turns with
llama-bench on a 12-layer F16 model, the large matmul sped up 1.89x from one thread to two, the
model's generation 1.52x, and a graph of the model's own weight shapes 1.57x. So each probe
here runs as many weights of the op's shape as hold ``kv_probe.PROBE_BYTES`` (each weight its
own, read cold as in a run), one after the other in one graph.

The shapes probed are those of a target's one-column matmuls that hold most of their bytes
(``COVER`` of them, at most ``MAX_SHAPES``), each in one graph computed ``RUNS`` times at each
count, the two counts in turn (``n_threads_b``): a shared machine's speed moves from one minute
to the next, and a ratio of two counts measured apart carries that. A shape not probed moves by the probed shapes of its type (their speed-ups
weighted by their bytes), else by ``instr peaks``' one-column matmul (``thread_scale``).

Used only where this machine is the logs' (``kv_probe.this_machine``), as the probe measures
this machine. What it measured is kept for the process (``_MEASURED``): a fit's leave-one-out
across thread counts and the prediction after it price a shape by the same measurement, and a
plan of many settings measures each shape once.
"""

from __future__ import annotations

import math
from typing import Any

from llamacpp_instr.converters.analysis.probe_shapes import WeightShape, one_column, weight_bytes
from llamacpp_instr.converters.reading.decode.graphs import Graph
from llamacpp_instr.running.probes.kv_probe import PROBE_BYTES

RUNS = 8  # computes a probe times at each count, in turn (after one untimed each): the fastest
# at each counts (a neighbour's burst slows a run, nothing speeds one)
COVER = 0.9
MAX_SHAPES = 6

# per (source count, target count, shape): the speed-up measured (the bytes it weighs are those of
# the graph at hand: a shape weighs by its share of each graph, not of the first that measured it)
_MEASURED: dict[tuple[int, int, WeightShape], float] = {}


class GemvProbe:
    """The one-column matmul probe on this process's CPU (device ``index``), the logs' thread
    count ``source`` against the target's ``target``; what it measured is kept. ``failed`` says
    why a shape could not be measured (it then moves as ``thread_scale`` says)."""

    def __init__(self, lib: Any, index: int, source: int, target: int) -> None:
        self.lib = lib
        self.index = index
        self.source = source
        self.target = target
        self.speedups: dict[WeightShape, float] = {}
        self.bytes: dict[WeightShape, int] = {}
        self.failed: dict[str, None] = {}
        # the graphs prepared already, by identity (held, so that an id is never reused): a fit
        # prices the same step graphs again and again
        self._seen: dict[int, Graph] = {}

    def prepare(self, graph: Graph) -> None:
        """Measure the shapes of ``graph``'s one-column matmuls not measured yet that hold most of
        their bytes (module doc)."""
        if id(graph) in self._seen:
            return
        self._seen[id(graph)] = graph
        shapes = one_column(graph)
        total = sum(shapes.values())
        if total <= 0:
            return
        todo: list[WeightShape] = []
        covered = sum(b for s, b in shapes.items() if s in self.speedups)
        for s, b in sorted(shapes.items(), key=lambda kv: -kv[1]):
            if covered >= COVER * total or len(self.speedups) + len(todo) >= MAX_SHAPES:
                break
            if s in self.speedups or s in self.bytes or weight_bytes(s) <= 0:
                continue
            todo.append(s)
            covered += b
        for s in todo:
            key = (self.source, self.target, s)
            if key not in _MEASURED:
                got = self._run(s)
                if got is None:
                    self.bytes[s] = shapes[s]
                    continue
                _MEASURED[key] = got
            self.speedups[s], self.bytes[s] = _MEASURED[key], shapes[s]

    def speedup(self, shape: WeightShape) -> float | None:
        """How much faster a one-column matmul of ``shape`` runs at the target's count than at the
        source's: measured, else the bytes-weighted speed-up of its type's measured shapes, else
        None."""
        if shape in self.speedups:
            return self.speedups[shape]
        same = [(s, v) for s, v in self.speedups.items() if s[0] == shape[0]]
        if not same:
            return None
        weights = [self.bytes.get(s, 1) for s, _ in same]
        return sum(w * v for w, (_, v) in zip(weights, same, strict=True)) / sum(weights)

    def _run(self, shape: WeightShape) -> float | None:
        """The source's time over the target's of ``shape``'s probe, their runs in turn."""
        from llamacpp_instr.native import bindings

        name, k, m = shape
        n_weights = max(1, min(math.ceil(PROBE_BYTES / weight_bytes(shape)), 4096))
        try:
            import gguf

            type_id = int(gguf.GGMLQuantizationType[name.upper()].value)
            p = self.lib.probe(
                bindings.PROBE_MATMUL, self.index, type_id, self.source, k, 1, RUNS,
                m=m, n_weights=n_weights, n_threads_b=self.target,
            )  # fmt: skip
        except (KeyError, bindings.SessionError) as exc:
            self.failed[f"a one-column matmul of {name} {k} x {m}: {exc}"] = None
            return None
        return float(p.best_ns) / max(float(p.best_ns_b), 1.0)


def for_logs(machines: list[dict[str, Any] | None], source: int, target: int) -> GemvProbe | None:
    """The probe of this machine's CPU at ``source`` and ``target`` threads, None where this
    machine is not the one every log names (``machines``: their ``session_start.machine``)."""
    from llamacpp_instr.running.probes import kv_probe

    found = kv_probe.this_machine(machines)
    if found is None:
        return None
    lib, here = found
    cpu = next((int(d["index"]) for d in here if d.get("type") == "cpu"), None)
    if cpu is None:
        return None
    from llama_cpp import _logger

    _logger.set_verbose(False)  # (the CPU's repacking says a line per weight; errors still shown)
    return GemvProbe(lib, cpu, source, target)
