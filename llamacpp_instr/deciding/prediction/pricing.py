"""A target's computes priced op by op (``Pricing``), on the graphs llama.cpp builds for it
(``GraphBuilder``, on the machine the caller hands in): per kind, their time, the devices and ops
it goes to, what no log measured, and attention beyond the logs' KV cells measured by the probe
(``kv_probe``) over its price at the logs' most cells (the anchor)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llamacpp_instr.converters.analysis.probe_shapes import attention_shape
from llamacpp_instr.converters.reading.decode.graphs import graph_table
from llamacpp_instr.deciding.measures import Machine, Meter
from llamacpp_instr.deciding.prediction import split_costs
from llamacpp_instr.deciding.prediction.kv_costs import (
    FLASH,
    KV_EXTRAPOLATION,
    n_kv,
    visible_cells,
)
from llamacpp_instr.deciding.prediction.op_costs import CostModel, GraphCosts
from llamacpp_instr.deciding.prediction.predict_lines import (
    beyond_line,
    deeper_line,
    missing_line,
    too_deep_line,
)
from llamacpp_instr.deciding.prediction.target import Prediction, Target, compute_cells, computes
from llamacpp_instr.running.run_config import RunConfig


class GraphBuilder:
    """The target's graphs, built by llama.cpp without weights on ``machine``, one per (n_tokens,
    n_kv); the logs' RPC servers stood in for where the target names none."""

    def __init__(self, t: Target, machine: Machine) -> None:
        machine.load(quiet=True)
        placed = machine.stand_ins(t.offload, t.rpc_servers)
        self.prober: Meter = machine.meter(t.model, placed, t.tensors)
        self.target = t
        self.cache: dict[tuple[int, int], tuple[GraphCosts, list[str]]] = {}

    def architecture(self) -> str:
        return self.prober.architecture()

    def graph(self, n_tokens: int, kv: int) -> tuple[GraphCosts, list[str]]:
        key = (n_tokens, kv)
        if key not in self.cache:
            t = self.target
            cfg = RunConfig(
                model=t.model,
                prompt="",
                n_ctx=kv,
                n_batch=n_tokens,
                n_ubatch=n_tokens,
                threads=t.threads,
                flash_attn=t.flash_attn,
                type_k=t.type_k,
                type_v=t.type_v,
            )
            rec = self.prober.graph(cfg, n_tokens)
            g = graph_table(rec)
            devs = [str(d) if d else "CPU" for d in rec.get("devices", [])]
            self.cache[key] = (GraphCosts.of(g), devs)
        return self.cache[key]

    def holders(self, n_tokens: int, kv: int) -> split_costs.Holders | None:
        """Where the weights a compute of ``n_tokens`` reads are held, where its graph runs on
        several devices and may offload ops (``split_costs.holders``, from the graph of one
        token at the same KV size); None for one token or one device."""
        gc, devs = self.graph(n_tokens, kv)
        if n_tokens <= 1 or len(set(devs)) <= 1:
            return None
        one, one_devs = self.graph(1, kv)
        return split_costs.holders(one.graph, one_devs)

    def close(self) -> None:
        self.prober.close()


@dataclass
class Tally:
    """One kind's computes priced so far (``Pricing.kind``)."""

    total: float = 0.0
    ok: bool = True
    used: set[str] = field(default_factory=set)  # the devices the computes run on
    dev_ns: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    op_ns: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    # op classes whose work goes beyond what the logs measured (op_costs.BEYOND)
    beyond: dict[tuple[str, str, str, str], float] = field(default_factory=dict)
    # at a thread count no log ran, the CPU's time per (what each op is, op) (thread_scale)
    bound: dict[tuple[str, str], float] = field(default_factory=dict)
    # attention ops on more KV cells than the logs' read (op_costs.KV_EXTRAPOLATION)
    deeper: dict[tuple[str, str, str, str], float] = field(default_factory=dict)
    # what the probe measured of attention beyond its anchors (kv_probe), ns
    measured: float = 0.0

    def add(self, labels: list[str], devs: list[str], ns: np.ndarray) -> None:
        """Each node's ``ns`` to its op and its device (the CPU past ``devs``)."""
        for k, c in enumerate(ns):
            if c:
                self.dev_ns[devs[k] if k < len(devs) else "CPU"] += c
                self.op_ns[labels[k]] += c

    def shares(self, out: Prediction, kind: str) -> None:
        """The shares of the kind's time per device, per op and, at a thread count no log ran,
        per what each CPU op is, put in ``out``."""
        s_dev = sum(self.dev_ns.values()) or 1.0
        s_op = sum(self.op_ns.values()) or 1.0
        out.by_device[kind] = {d: v / s_dev for d, v in sorted(self.dev_ns.items())}
        out.by_op[kind] = {
            o: v / s_op for o, v in sorted(self.op_ns.items(), key=lambda kv: -kv[1])
        }
        if self.bound:
            s_b = sum(self.bound.values()) or 1.0
            by: dict[str, dict[str, float]] = defaultdict(dict)
            for (what, op), ns in sorted(self.bound.items(), key=lambda kv: -kv[1]):
                by[what][op] = ns / s_b
            out.op_bounds[kind] = dict(by)


class Pricing:
    """The computes of a target priced kind by kind, what no log measured gathered across them."""

    def __init__(self, builder: GraphBuilder, t: Target, probe: Any = None) -> None:
        self.builder = builder
        self.t = t
        self.probe = probe
        self.missing: dict[str, None] = {}
        self.proxies: dict[str, None] = {}
        self.extrapolated: dict[str, None] = {}
        self.deeper: dict[str, bool] = {}  # per kind: whether an attention op was extrapolated
        # per kind: attention beyond the logs' KV cells measured by the probe (kv_probe), its
        # time over the anchor's (ns, the kind's computes together), and what was measured
        self.measured: dict[str, float] = {}
        self.probed: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = defaultdict(dict)

    def kind(
        self,
        model: CostModel,
        kind: str,
        plan: list[tuple[int, int]],
        first: bool,
        out: Prediction | None = None,
    ) -> tuple[float | None, frozenset[str]]:
        """A kind's computes (``plan``; ``first``: the session's first, which allocates the RPC
        servers' buffers) priced by ``model``: their time (None where something is not covered:
        added to ``missing``), the devices they run on; with ``out``, the shares of time per
        device and op put in it."""
        t = self.t
        tally = Tally()
        for group, (count, cells) in self.groups(kind, plan).items():
            self.group(model, kind, group, count, cells / count, first, tally)
        if tally.beyond:
            self.missing[beyond_line(kind, tally.beyond, t)] = None
            tally.ok = False
        far = max(kv for _n, kv in plan) / model.max_kv if model.max_kv else 1.0
        if tally.deeper and far > KV_EXTRAPOLATION:
            self.missing[too_deep_line(kind, far, model.max_kv, t)] = None
            tally.ok = False
        elif tally.deeper:
            self.extrapolated[deeper_line(kind, tally.deeper, far, model.max_kv)] = None
            self.deeper[kind] = True
        if first:
            # the session's first step allocates its compute buffers on the RPC servers
            setup = model.splits.net.setup_ns()
            tally.total += setup
            if setup:
                tally.dev_ns["network"] += setup
        if tally.measured:
            self.measured[kind] = tally.measured
        if not tally.ok or tally.total <= 0:
            return None, frozenset(tally.used)
        if out is not None:
            tally.shares(out, kind)
        return tally.total, frozenset(tally.used)

    def groups(
        self, kind: str, plan: list[tuple[int, int]]
    ) -> dict[tuple[int, int, bool], tuple[int, int]]:
        """A kind's computes by (n_tokens, n_kv, whether its graph is sent whole to an RPC
        server): how many, and the KV cells their rows see in all. (A graph other than the
        previous compute's is sent whole; the prompt's last compute is the previous of
        generation's first.)"""
        t = self.t
        out: dict[tuple[int, int, bool], tuple[int, int]] = {}
        last = computes(t)[0][-1] if kind == "gen" and t.n_prompt > 0 else None
        seen = compute_cells(t)[0 if kind == "prompt" else 1]
        for key, n_cells in zip(plan, seen, strict=True):
            count, cells = out.get((key[0], key[1], key != last), (0, 0))
            out[(key[0], key[1], key != last)] = (count + 1, cells + n_cells)
            last = key
        return out

    def group(
        self,
        model: CostModel,
        kind: str,
        group: tuple[int, int, bool],
        count: int,
        mean: float,
        first: bool,
        tally: Tally,
    ) -> None:
        """``count`` computes of one ``group`` (``groups``; ``mean``: the KV cells their rows
        see, on average: flash attention's time is linear in it) priced into ``tally``."""
        t = self.t
        n_tok, kv, resend = group
        gc, devs = self.builder.graph(n_tok, kv)
        tally.used |= {d or "CPU" for d, nop in zip(devs, gc.noop, strict=False) if not nop}
        held = self.builder.holders(n_tok, kv)
        once: dict[tuple[str, str], float] = {}
        deep: dict[tuple[str, str, str, str], float] = {}
        cost, extra, miss, lost = model.price_compute(
            gc, devs, t.threads, kind, resend, held, self.proxies, tally.beyond, once, deep, mean
        )
        found = self._probed(model, kind, group, gc, devs, mean, cost, deep)
        if found is not None:
            cost, over_anchor = found
            tally.measured += count * float(over_anchor.sum())
            tally.add(gc.labels, devs, count * over_anchor)
        else:
            for cls, v in deep.items():
                tally.deeper[cls] = max(tally.deeper.get(cls, 0.0), v)
        for pair, ns in once.items():
            tally.bound[pair] = tally.bound.get(pair, 0.0) + count * ns
        for line in [missing_line(m, t) for m in miss] + lost:
            self.missing[line] = None
            tally.ok = False
        over = model.overhead_at(t.threads, kind, t.depth > 0 and first)
        tally.total += count * (float(cost.sum()) + sum(extra.values()) + over)
        tally.add(gc.labels, devs, count * cost)
        for d, v in extra.items():
            tally.dev_ns[d] += count * v

    def _probed(
        self,
        model: CostModel,
        kind: str,
        group: tuple[int, int, bool],
        gc: GraphCosts,
        devs: list[str],
        cells: float,
        cost: np.ndarray,
        deep: dict[tuple[str, str, str, str], float],
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """A group of computes whose attention reads more KV cells than the logs' did, priced
        by the probe (``kv_probe``): each node's price at the anchor (the graph at the logs'
        most cells, priced by the model), and each attention op's measured time over it. None
        where there is no probe, nothing beyond the logs, or an attention op the probe cannot
        measure (the line per cell prices the group then, as ``deep`` says)."""
        if self.probe is None or not deep or not model.max_kv:
            return None
        n_tok, kv, resend = group
        pos0 = max(int(round((cells - n_tok * (n_tok + 1) / 2) / n_tok)), 0)
        # the anchor: the same ubatch at the most cells the logs read (or its own, if more)
        pos0_a = max(0, min(pos0, model.max_kv - n_tok))
        if model.flash and any(gc.labels[k] == FLASH for k in np.flatnonzero(gc.kv)):
            # flash attention's time is in the cells its rows see, not the cache's: its anchor
            # sees no more than the logs' computes did (a line carried from a generation's few
            # dozen cells to a prompt's thousands priced a 512-deep prompt 20 % slow)
            seen = min(line.cells_hi for line in model.flash.values())
            pos0_a = min(pos0_a, max(0, int((seen - n_tok * (n_tok + 1) / 2) // n_tok)))
        kv_a = max(model.max_kv, n_kv(pos0_a + n_tok, 1 << 30))
        if kv_a >= kv:
            return None
        gc_a, devs_a = self.builder.graph(n_tok, kv_a)
        if gc_a.labels != gc.labels or gc_a.roles != gc.roles or devs_a != devs:
            return None
        held_a = self.builder.holders(n_tok, kv_a)
        anchor, _e, miss, _l = model.price_compute(
            gc_a, devs_a, self.t.threads, kind, resend, held_a, None, None, None, None,
            float(visible_cells(pos0_a, n_tok)),
        )  # fmt: skip
        if miss:
            return None
        shapes = {
            int(k): attention_shape(gc.graph, int(k), gc.roles[k]) for k in np.flatnonzero(gc.kv)
        }
        if any(v is None for v in shapes.values()) or not shapes:
            return None
        priced = cost.copy()
        over = np.zeros_like(cost)
        for k, sh in shapes.items():
            assert sh is not None
            dev = devs[k] if k < len(devs) else "CPU"
            deep_ns = self.probe.ns(sh, pos0, dev)
            at_ns = self.probe.ns(sh.at(kv_a), pos0_a, dev)
            if deep_ns is None or at_ns is None:
                return None
            priced[k] = anchor[k]
            over[k] = max(deep_ns - at_ns, -anchor[k])
            self.probed[kind][(sh, kv, pos0, dev)] = {
                "op": sh.op, "device": dev, "rows": sh.rows, "n_kv": kv, "pos0": pos0,
                "us_a_layer": deep_ns / 1e3, "anchor_us_a_layer": at_ns / 1e3,
                "anchor_n_kv": kv_a, "anchor_pos0": pos0_a, "anchor_priced_us": anchor[k] / 1e3,
            }  # fmt: skip
        return priced, over
