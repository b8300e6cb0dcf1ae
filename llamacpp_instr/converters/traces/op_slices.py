"""Op slices one by one: the ops of a compute that its ``ComputeBatch`` leaves out (those with
KV-cache flows, and every op of a compute whose ops the bulk writers leave to the per-op view:
``Compute.per_op``), each its own slice with its flows and args, and with thread timings
(verbose logs) each worker thread's share of it on that thread's track."""

from __future__ import annotations

from collections.abc import Iterator

from ..reading.decode.computes import Compute, OpTiming
from ..reading.decode.sessions import SessionInfo
from ..session.kv_flows import OpFlows
from ..session.machine_peaks import Roof
from .items import Item, LayoutStats, Selection, Slice, Track, track_uuid
from .op_args import op_args


class OpSlices:
    """A session's op slices one by one, and its worker threads' tracks."""

    def __init__(
        self, info: SessionInfo, process: Track, sel: Selection, roof: Roof | None
    ) -> None:
        self.info = info
        self.process = process
        self.pid = process.pid
        self.sel = sel
        self.roof = roof  # the roofs its ops' args are set against (None: no peaks known)
        self.threads: dict[int, Track] = {}

    def thread_track(self, t: int) -> Iterator[Item]:
        if t not in self.threads:
            tr = Track(
                track_uuid(self.info.sid, "thread", t),
                f"thread {t}",
                self.process.uuid,
                "slices",
                10 + t,
                self.pid,
            )
            self.threads[t] = tr
            yield tr

    def op_list(
        self,
        ops: list[tuple[int, OpTiming]],
        c: Compute,
        track: int,
        stats: LayoutStats,
        flows: OpFlows,
    ) -> Iterator[Item]:
        """The slices of ``ops`` (``batch``'s), in order."""
        for k, op in ops:
            yield from self.op_slices(k, op, c, track, stats, flows)

    def op_slices(
        self, k: int, op: OpTiming, c: Compute, track: int, stats: LayoutStats, flows: OpFlows
    ) -> Iterator[Item]:
        """The slice of the ``k``-th op of ``c`` (if the selection wants it), and its worker
        threads' slices (verbose logs)."""
        layer = op.node.layer
        if self.sel.layer is not None and layer != self.sel.layer:
            return
        stats.ops += 1
        depth = 3 if layer is not None else 2
        out, into = flows.get(k, ((), ()))
        yield Slice(
            track,
            op.node.label,
            op.start,
            op.dur,
            depth,
            "op",
            op_args(op, c, self.roof),
            out,
            into,
        )
        if op.thread_done:
            for t, done in enumerate(op.thread_done):
                if done <= 0:
                    continue  # this worker had no share of the op
                yield from self.thread_track(t)
                tr = self.threads[t]
                yield Slice(
                    tr.uuid,
                    op.node.label,
                    op.start,
                    min(done, op.dur),
                    0,
                    "thread",
                    {"busy_ns": done, "wait_ns": max(0, op.dur - done)},
                )
