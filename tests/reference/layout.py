"""The per-op trace layout: every op slice its own item, every compute's ops as objects.

The production layout (``layout.layout_bulk``) gives each compute as one ``ComputeBatch``
whose ops the writers encode in bulk; this one yields what that batch stands for, item by
item, from the lazy per-op view of each compute (``Compute.unpack``): the compute's slice,
its layer slices, then each op's slice in log order. The reference writer
(``reference.perfetto_writer``) and the reference Chrome writer read it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from llamacpp_instr.converters.reading.decode.columns import LayerSpan
from llamacpp_instr.converters.reading.decode.computes import Compute
from llamacpp_instr.converters.reading.decode.sessions import Event, SessionInfo
from llamacpp_instr.converters.session.kv_flows import KvFlows, OpFlows
from llamacpp_instr.converters.session.machine_peaks import Roof
from llamacpp_instr.converters.traces.items import Item, LayoutStats, Selection, Slice
from llamacpp_instr.converters.traces.layout import SessionLayout, layout_sessions


class PerOpLayout(SessionLayout):
    def compute_batch(  # type: ignore[override]
        self,
        head: Slice,
        c: Compute,
        spans: Sequence[LayerSpan],
        stats: LayoutStats,
        flows: OpFlows,
        mask: Any = None,
        run: slice | None = None,
    ) -> Iterator[Item]:
        yield head
        for lay in self.spans(spans, stats):
            args = {"layer": lay.layer, "n_ops": lay.n_ops}
            yield Slice(head.track, f"layer {lay.layer}", lay.start, lay.dur, 2, "layer", args)
        if not self.sel.ops or c.graph is None:
            return
        for k, op in enumerate(c.unpack()):
            if mask is None or mask[k]:
                yield from self.per_op.op_slices(k, op, c, head.track, stats, flows)


def layout(
    events: Iterator[Event],
    sel: Selection,
    stats: LayoutStats,
    *,
    flows: KvFlows | None = None,
    roofs: Callable[[SessionInfo], Roof | None] | None = None,
) -> Iterator[Item]:
    """The per-op items of every session (see the module doc); ``roofs`` as for
    ``layout_bulk``."""

    def make(info: SessionInfo, k: int) -> SessionLayout:
        return PerOpLayout(info, k, sel, stats, flows, roofs(info) if roofs else None)

    return cast(Iterator[Item], layout_sessions(events, make))
