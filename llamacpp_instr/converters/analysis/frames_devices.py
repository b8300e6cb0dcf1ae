"""The analysis API's tables for a run on several devices (``frames.load_session``), built by
``frames``' builder as it reads the steps (``DeviceBuilder``: their rows, ``device_rows``; made
frames at the end, ``device_frames``). A session whose machine lists one device (CPU-only) has
none of them, and its tables have no device columns.

* ``ops.device``, ``layers.device``: the device that ran each op and timed each layer span
  (ggml's device names, a categorical in the machine's order; ``device_time.op_devices``).
* ``devices`` — the machine's devices: device, index, backend, description (an RPC server's
  HOST:PORT), type, remote_timing, memory_total.
* ``splits`` — what ggml's scheduler ran: step, ubatch, split, device, node_start, node_end,
  t_start, t_launch, t_end (host times), inputs_ns (its input copies), launch_ns (launch to return).
* ``copies`` — step, ubatch, split, node, tensor, bytes, src, dst, t_start, dur_ns (host times).
* ``busy`` — what a device timed itself (Vulkan: command buffers): step, ubatch, device, split,
  n_ops, t_start, dur_ns.
* ``remote`` — graphs RPC servers computed and timed: step, ubatch, split, device, t_send, t_reply,
  t_start, t_end, dur_ns, one_way_ns, err_ns, clock_offset_ns, bytes, n_ops.
* ``transfers`` — every command sent to an RPC server: phase, step, device, cmd, tensor, bytes,
  sent, recv, t_queue, t_start, t_sent, t_end, dur_ns.
* ``device_steps`` — per step (and ``load``: the commands before the session, step -1) and device,
  the figures of ``device_time.step_time``: compute_ns (its own measure), share, op_ns, n_ops,
  layer_ns, n_layers, outstanding_ns, idle_ns, gap_ns, wait_ns, copies and transfers.
* ``token_time`` — per step (and ``load``): its window (token_ns) split into compute_ns,
  transfer_ns and host_ns.
"""

from __future__ import annotations

from array import array
from itertools import chain
from typing import Any

import numpy as np
import pandas as pd

from ..reading.decode.computes import Compute
from ..reading.decode.placement import Placement
from ..reading.decode.sessions import SessionInfo
from ..reading.decode.steps import Step
from ..reading.decode.transfers import Transfers
from ..session import device_time as dt
from ..session.step_times import StepRows, step_times
from .device_frames import DeviceFrames
from .device_rows import (
    KeyedRows,
    Rows,
    keys_array,
    make_busy,
    make_copies,
    make_remote,
    make_splits,
    make_transfers,
)

TABLES = (
    "devices",
    "splits",
    "copies",
    "busy",
    "remote",
    "transfers",
    "device_steps",
    "token_time",
)

_COLS: dict[str, list[str]] = {
    "splits": "step ubatch split device node_start node_end t_start t_launch t_end inputs_ns "
    "launch_ns".split(),
    "copies": "step ubatch split node tensor bytes src dst t_start dur_ns".split(),
    "busy": "step ubatch device split n_ops t_start dur_ns".split(),
    "remote": "step ubatch split device t_send t_reply t_start t_end dur_ns one_way_ns err_ns "
    "clock_offset_ns bytes n_ops".split(),
    "transfers": "phase step device cmd tensor bytes sent recv t_queue t_start t_sent t_end "
    "dur_ns".split(),
    "device_steps": "step kind device timed compute_ns share op_ns n_ops layer_ns n_layers "
    "outstanding_ns idle_ns gap_ns wait_ns copy_in_bytes copy_out_bytes copy_ns sent_bytes "
    "recv_bytes data_bytes net_ns n_cmds transfer_bytes transfer_ns".split(),
    "token_time": "step kind n_tokens t_start token_ns compute_ns transfer_ns host_ns".split(),
}
# the tables made of the decoder's rows (``KeyedRows``)
_MAKE = {
    "splits": make_splits,
    "copies": make_copies,
    "busy": make_busy,
    "remote": make_remote,
    "transfers": make_transfers,
}
_PLACES = 16  # placements kept before their rows join the tables (few: ``PACK_ROWS``)


class DeviceBuilder:
    """The device tables of one session, as its steps are read."""

    def __init__(self, info: SessionInfo) -> None:
        self.info = info
        self.devs = dt.Devices(info)
        self.frames = DeviceFrames(info, self.devs)  # (the tables' frames, at the end)
        self.rows: dict[str, Rows] = {k: Rows(cols) for k, cols in _COLS.items()}
        # (the decoder's rows as they are, a list at a time)
        self.keyed = {name: KeyedRows(_COLS[name], make) for name, make in _MAKE.items()}
        self.rows.update(self.keyed)
        # where the ops ran: each distinct placing (``device_time.op_placing``: one per graph
        # and splits), held here (so that its id stays its own) with its position
        self.placings: list[list[Any]] = []
        self.placing_at: dict[int, int] = {}
        self.layer_device: list[np.ndarray] = []
        # for ``step_times``, each step by its position in the session (``g``): per step its
        # index, token count, window start and end before its commands, and its commands' rows;
        # per compute with ops, layers or a placement: the step, and its rows of each
        self.g = 0
        self.step_keys = array("q")  # index, n_tokens, lo, hi, n_cmds
        self.kinds: list[str] = []
        self.op_keys = array("q")  # per compute with ops: g, n, its placing's position
        self.layer_keys = array("q")  # g, n, whether the compute's spans name their devices
        self.place_keys = array("q")  # g, splits, copies, busy, remote
        self.places: list[tuple[int, int, int, Placement]] = []  # (g, step, ubatch, placement)

    def ops(self, c: Compute) -> None:
        """A compute's ops were added to the ops table: their devices."""
        got = dt.op_placing(c, self.devs.cpu)
        k = self.placing_at.get(id(got))
        if k is None:
            k = self.placing_at[id(got)] = len(self.placings)
            self.placings.append(got)
        self.op_keys.extend((self.g, len(c.op_node), k))

    def layers(self, c: Compute) -> None:
        """A compute's layer spans were added to the layers table: their devices."""
        ld = c.layer_device  # (made the CPU backend's where none is named, all at once at the end)
        if ld is not None:
            self.layer_device.append(ld)
        self.layer_keys.extend((self.g, len(c.layers), ld is not None))

    def step(self, s: Step) -> None:
        hi = s.end
        for c in s.computes:
            self._compute(s.index, -1 if c.ubatch is None else c.ubatch, c)
            hi = max(hi, c.start + c.dur)
        n_cmds = 0
        for t in s.transfers:
            self._transfers(t, s.index)
            n_cmds += t.n_rows
        self.step_keys.extend((s.index, s.n_tokens, s.start, hi, n_cmds))
        self.kinds.append(s.kind)
        self.g += 1

    def _compute(self, step: int, ub: int, c: Compute) -> None:
        if c.place is not None:
            self.places.append((self.g, step, ub, c.place))
            if len(self.places) >= _PLACES:
                self._add_places()

    def _add_places(self) -> None:
        """The placements kept so far, as rows of their tables: a batch at a time, the rows as
        the decoder kept them (``Placement.bulk``), with no Python call per compute."""
        places, self.places = self.places, []
        bulk = [p.bulk() for *_, p in places]
        keys = [(step, ub, t0) for (_, step, ub, _), (_, t0) in zip(places, bulk, strict=True)]
        self.place_keys.extend(
            chain.from_iterable(
                (x[0], *map(len, rows)) for x, (rows, _) in zip(places, bulk, strict=True)
            )
        )
        for j, name in enumerate(("splits", "copies", "busy", "remote")):
            self.keyed[name].add_lists(keys, [rows[j] for rows, _ in bulk])

    def _transfers(self, t: Transfers, step: int) -> None:
        rows, t0 = t.bulk_rows()
        self.keyed["transfers"].add((t.phase, step, t0), rows)

    def _time(self, st: dt.StepTime) -> None:
        for d in self.devs.order(st.devices):
            x = st.devices[d]
            self.rows["device_steps"].append(
                (st.step, st.kind, d, x.timed, x.compute_ns, x.share, x.op_ns, x.n_ops,
                 x.layer_ns, len(x.layers), x.outstanding_ns, x.idle_ns, x.gap_ns, x.wait_ns,
                 x.copy_in_bytes, x.copy_out_bytes, x.copy_ns, x.sent_bytes, x.recv_bytes,
                 x.data_bytes, x.net_ns, x.n_cmds, x.transfer_bytes, x.transfer_ns)
            )  # fmt: skip
        self.rows["token_time"].append(
            (st.step, st.kind, st.n_tokens, st.start, st.token_ns, st.compute_ns, st.transfer_ns,
             st.host_ns)
        )  # fmt: skip

    # -- the tables

    def _layer_devices(self) -> np.ndarray:
        """Each layer span's device (``device_time.layer_devices``, for every compute at once)."""
        keys = keys_array(self.layer_keys, 3)
        out = np.full(int(keys[:, 1].sum()), -1, np.int64)
        if self.layer_device:
            out[np.repeat(keys[:, 2] != 0, keys[:, 1])] = np.concatenate(self.layer_device)
        out[out < 0] = self.devs.cpu
        return out

    def tables(self, ops: pd.DataFrame, layers: pd.DataFrame) -> dict[str, pd.DataFrame]:
        """The device tables; ``ops`` and ``layers`` get their device column."""
        self._add_places()
        at = keys_array(self.op_keys, 3)[:, 2].tolist()
        ops["device"] = self.frames.device_column(
            [dt.placing_devices(self.placings[k]) for k in at], len(ops)
        )
        self.layer_device = [self._layer_devices()]
        layers["device"] = self.frames.device_column(self.layer_device, len(layers))
        dev_cols, token_cols = step_times(_step_rows(self, ops, layers), self.devs)
        self.rows["device_steps"].put(dev_cols)
        self.rows["token_time"].put(token_cols)
        in_steps = self.rows["transfers"]
        self.rows["transfers"] = self.keyed["transfers"] = KeyedRows(
            _COLS["transfers"], make_transfers
        )
        for t in self.info.transfers:  # (the model's upload came first)
            self._transfers(t, -1)
        self.rows["transfers"].then(in_steps)
        load = dt.load_time(self.info.transfers, self.devs)
        if load.devices:
            self._time(load)
        out = {"devices": self.frames.devices()}
        for name in _COLS:
            out[name] = self.frames.frame(_COLS[name], self.rows[name])
            del self.rows[name]  # (its columns are in the frame now: not held twice)
        self.keyed.clear()
        return out


def _op_groups(b: DeviceBuilder, ops: pd.DataFrame) -> tuple[Any, ...]:
    """Per compute with ops and device: its step position, the device, the ops' time (summed
    from the ops table's durations, each compute's ops in device order) and their count."""
    keys = keys_array(b.op_keys, 3)
    if not len(keys):
        return ((), (), (), ())
    # each placing's devices and their op counts, placing after placing
    groups = [dt.placing_groups(p) for p in b.placings]
    n_dev = np.array([len(x[0]) for x in groups], np.int64)
    devs = np.array(list(chain.from_iterable(x[0] for x in groups)), np.int64)
    counts = np.array(list(chain.from_iterable(x[1] for x in groups)), np.int64)
    # each compute's: its placing's, in order
    k = keys[:, 2]
    m = n_dev[k]
    row = (
        np.repeat(np.cumsum(n_dev)[k] - m, m)
        + np.arange(int(m.sum()))
        - np.repeat(np.cumsum(m) - m, m)
    )
    n_op = keys[:, 1]
    order = np.concatenate([groups[j][2] for j in k.tolist()])
    at = np.repeat(np.cumsum(n_op) - n_op, n_op) + order
    n = counts[row]
    dur = np.add.reduceat(ops["dur_ns"].to_numpy(dtype=np.int64)[at], np.cumsum(n) - n)
    return np.repeat(keys[:, 0], m), devs[row], dur, n


def _step_rows(b: DeviceBuilder, ops: pd.DataFrame, layers: pd.DataFrame) -> StepRows:
    """What ``step_times`` reads, from the tables' columns (see ``DeviceBuilder.__init__``)."""
    steps = keys_array(b.step_keys, 5)
    rows = b.rows
    n_lay, place = keys_array(b.layer_keys, 3), keys_array(b.place_keys, 5)
    per = [np.repeat(place[:, 0], place[:, j]) for j in range(1, 5)]
    base = np.cumsum(place[:, 1]) - place[:, 1]  # each compute's first split row

    def split_rows(table: str, j: int) -> np.ndarray:
        k = rows[table].column("split")
        row = np.repeat(base, place[:, j]) + k
        return np.where(k >= 0, row, -1)

    def col(table: str, name: str) -> Any:
        return rows[table].column(name)

    cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64)  # noqa: E731
    return StepRows(
        index=steps[:, 0], kind=b.kinds, n_tokens=steps[:, 1], lo=steps[:, 2], hi=steps[:, 3],
        op=_op_groups(b, ops),
        layer=(np.repeat(n_lay[:, 0], n_lay[:, 1]), cat(b.layer_device),
               layers["layer"].to_numpy(), layers["dur_ns"].to_numpy()),
        split=(per[0], col("splits", "device"), col("splits", "t_launch"), col("splits", "t_end")),
        copy=(per[1], col("copies", "src"), col("copies", "dst"), col("copies", "bytes"),
              col("copies", "t_start"), col("copies", "dur_ns")),
        busy=(per[2], col("busy", "device"), split_rows("busy", 3), col("busy", "t_start"),
              col("busy", "t_start") + col("busy", "dur_ns")),
        remote=(per[3], col("remote", "device"), split_rows("remote", 4),
                col("remote", "t_start"), col("remote", "t_end")),
        cmd=(np.repeat(np.arange(len(steps)), steps[:, 4]), col("transfers", "device"),
             col("transfers", "sent"), col("transfers", "recv"), col("transfers", "bytes"),
             col("transfers", "t_start"), col("transfers", "t_end")),
    )  # fmt: skip
