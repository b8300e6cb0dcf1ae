"""A model's matmuls at a thread count no log ran, measured: the native probe (kind MATMUL) runs
weights of each op's own shape and type, by as many columns as the op multiplies, on this
machine's CPU, at the logs' thread count and at the target's in turn, and the op moves by what
it measured.

One large matmul (``instr peaks``' ``gemv``, one weight of 96 MiB by one column, and its
``matmul``, 2048 x 2048 by 512) does not move as a model's do: a model reads many weights of a
few MiB each, one op after another, each op's threads starting and meeting again. On a 2-core
VM, in turns with llama-bench on a 12-layer F16 model, the one large weight sped up 1.89x from one
thread to two, the model's generation 1.52x, and a graph of the model's own weight shapes 1.57x;
the peaks' matmul read a Q4_1 prompt's 1 -> 2 as 1.77x in one measurement and 2.11x in the
next, where the prompt sped up 1.5 to 1.6x. So each probe runs weights of the op's shape, one
after the other in one graph: for a generated token (one column) as many as hold
``kv_probe.PROBE_BYTES`` (each weight its own, read cold as in a run); for more columns as many
as make ``PROMPT_FLOP`` of work (a prompt's matmul is compute-bound: where its weight comes from
matters little, and a prompt of 200 tokens through 256 MiB of weights would take seconds).

The shapes probed are those of a target's matmuls holding most of their FLOPs (``COVER`` of
them, at most ``MAX_SHAPES`` a graph), each in one graph computed ``RUNS`` times at each count,
the two counts in turn (``n_threads_b``): a shared machine's speed moves from one minute to the
next, and a ratio of two counts measured apart carries that. A shape not probed moves by the
probed shapes of its type and columns (their speed-ups weighted by their FLOPs), else as
``thread_scale`` prices it without the probe.

Used only where this machine is the logs' (``kv_probe.same_machine``), as the probe measures
this machine. What it measured is kept for the process (``_MEASURED``): a fit's leave-one-out
across thread counts and the prediction after it price a shape by the same measurement, and a
plan of many settings measures each shape once.
"""

from __future__ import annotations

import math
from typing import Any

from llamacpp_instr.converters.reading.decode.graphs import Graph, Node
from llamacpp_instr.converters.session import derive
from llamacpp_instr.deciding.prediction.kv_probe import PROBE_BYTES

# computes a probe times at each count, in turn (after one untimed each): the fastest at each
# counts (a neighbour's burst slows a run, nothing speeds one)
RUNS = 8
COVER = 0.9
MAX_SHAPES = 6
PROMPT_FLOP = 1e9  # the work of a probe of a matmul of several columns (~30 ms on one core)

# (weight type, k, m, n): the weight's row length and its rows, the columns it multiplies
MatmulShape = tuple[str, int, int, int]

# per (source count, target count, shape): the speed-up measured and the FLOPs it weighs
_MEASURED: dict[tuple[int, int, MatmulShape], tuple[float, float]] = {}


def weight_bytes(shape: MatmulShape) -> int:
    """A weight's bytes (its type's blocks over its ``k x m`` values), 0 for a type gguf does not
    know."""
    import gguf

    name, k, m, _n = shape
    try:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name.upper()]]
    except KeyError:
        return 0
    return k // block * size * m


def flops(shape: MatmulShape) -> float:
    _name, k, m, n = shape
    return 2.0 * k * m * n


def shape_of(node: Node, graph: Graph) -> MatmulShape | None:
    """What a matmul of a weight of two dimensions (MUL_MAT, its output ``[m, n]``) multiplies,
    None for any other node."""
    if node.op != "MUL_MAT" or any(int(x) != 1 for x in node.shape[2:]):
        return None
    src = node.src[0] if node.src else {}
    if src.get("kind") != "weight":
        return None
    dims = [int(x) for x in derive.src_shape(src, graph)] + [1, 1]
    if dims[2] != 1 or dims[3] != 1:
        return None
    # (a graph's shapes drop trailing dimensions of 1: one column's output is [m])
    n = int(node.shape[1]) if len(node.shape) > 1 else 1
    return (str(src.get("type") or ""), dims[0], dims[1], n)


def matmuls(graph: Graph) -> dict[MatmulShape, int]:
    """The matmuls ``graph`` multiplies a weight by, per shape, how many."""
    out: dict[MatmulShape, int] = {}
    for node in graph.nodes:
        key = shape_of(node, graph)
        if key is not None:
            out[key] = out.get(key, 0) + 1
    return out


class MatmulProbe:
    """The matmul probe on this process's CPU (device ``index``), the logs' thread count
    ``source`` against the target's ``target``. ``failed`` says why a shape could not be
    measured (it then moves as ``thread_scale`` prices it without the probe)."""

    def __init__(self, lib: Any, index: int, source: int, target: int) -> None:
        self.lib = lib
        self.index = index
        self.source = source
        self.target = target
        self.speedups: dict[MatmulShape, float] = {}
        self.weights: dict[MatmulShape, float] = {}  # each measured shape's FLOPs in its graph
        self.tried: set[MatmulShape] = set()
        self.failed: dict[str, None] = {}
        self.runs = 0

    def prepare(self, graph: Graph) -> None:
        """Measure the shapes of ``graph``'s matmuls not measured yet that hold most of their
        FLOPs (module doc)."""
        work = {s: c * flops(s) for s, c in matmuls(graph).items()}
        total = sum(work.values())
        covered = sum(w for s, w in work.items() if s in self.speedups)
        todo: list[MatmulShape] = []
        for s, w in sorted(work.items(), key=lambda kv: -kv[1]):
            if covered >= COVER * total or len(todo) >= MAX_SHAPES:
                break
            if s in self.tried or weight_bytes(s) <= 0:
                continue
            todo.append(s)
            covered += w
        for s in todo:
            self.tried.add(s)
            key = (self.source, self.target, s)
            if key not in _MEASURED:
                got = self._run(s)
                if got is None:
                    continue
                _MEASURED[key] = (got, work[s])
            self.speedups[s], self.weights[s] = _MEASURED[key]

    def speedup(self, shape: MatmulShape) -> float | None:
        """How much faster a matmul of ``shape`` runs at the target's count than at the source's:
        measured, else the FLOPs-weighted speed-up of the measured shapes of its type and columns
        (one column, or several), else None."""
        if shape in self.speedups:
            return self.speedups[shape]
        same = [
            (self.weights[s], v)
            for s, v in self.speedups.items()
            if s[0] == shape[0] and (s[3] == 1) == (shape[3] == 1)
        ]
        if not same:
            return None
        return sum(w * v for w, v in same) / sum(w for w, _ in same)

    def _run(self, shape: MatmulShape) -> float | None:
        """The source's time over the target's of ``shape``'s probe, their runs in turn."""
        from llamacpp_instr.native import bindings

        name, k, m, n = shape
        if n == 1:
            n_weights = math.ceil(PROBE_BYTES / weight_bytes(shape))
        else:
            n_weights = math.ceil(PROMPT_FLOP / flops(shape))
        n_weights = max(1, min(n_weights, 4096))
        try:
            import gguf

            type_id = int(gguf.GGMLQuantizationType[name.upper()].value)
            p = self.lib.probe(
                bindings.PROBE_MATMUL, self.index, type_id, self.source, k, n, RUNS,
                m=m, n_weights=n_weights, n_threads_b=self.target,
            )  # fmt: skip
        except (KeyError, bindings.SessionError) as exc:
            self.failed[f"a matmul of {name} {k} x {m} by {n}: {exc}"] = None
            return None
        self.runs += 1
        return float(p.best_ns) / max(float(p.best_ns_b), 1.0)


def for_logs(machines: list[dict[str, Any] | None], source: int, target: int) -> MatmulProbe | None:
    """The probe of this machine's CPU at ``source`` and ``target`` threads, None where this
    machine is not the one every log names (``machines``: their ``session_start.machine``)."""
    from llamacpp_instr.deciding.prediction import kv_probe
    from llamacpp_instr.native import bindings

    lib = bindings.load()
    if not kv_probe.same_machine(lib, machines):
        return None
    here = lib.machine_info().get("devices", [])
    cpu = next((int(d["index"]) for d in here if d.get("type") == "cpu"), None)
    if cpu is None:
        return None
    from llama_cpp import _logger

    _logger.set_verbose(False)  # (the CPU's repacking says a line per weight; errors still shown)
    return MatmulProbe(lib, cpu, source, target)
