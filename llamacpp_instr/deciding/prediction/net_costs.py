"""What an RPC server's network cost in a measured run: the link ``instr predict`` prices the
commands of a setting not run with, or another link given by its rate and round trip.

A command on an RPC connection is priced as its round trips times the link's round trip time,
plus its bytes (sent and received, framing included) at the link's rate:

    time = round_trips * rtt + (sent + recv) * ns_per_byte

Each RPC device's link is fitted from the commands its log holds (``transfers``):

- **rate:** the model's upload (``set_tensor`` commands of at least ``BIG`` bytes, which have no
  reply): the median of their host time per byte sent. A command bigger than the client's TCP send
  buffer is handed to the kernel no faster than the link drains it;
- **round trip:** the median time of the small commands the server answers at once
  (``get_alloc_size``, ``get_device_memory``...: a few bytes each way), or, without them, twice
  the median one-way network time the server's own graph timing measured (``remote``).

A split on an RPC device sends each input it copies from another device (``set_tensor``: bytes at
the rate, no reply), its graph (``graph_compute``: the serialized graph, at the log's bytes per node;
``graph_recompute``, a few bytes, when the server holds the same graph, as generation steps do), and
a tensor read back from it (``get_tensor``: one round trip and the bytes), whether another device's
split reads it or the program reads the logits after the compute. Steps are serial on the client
(the next command waits for the read that precedes it), so the commands' times add up. A session's
first step also allocates its compute buffers on each server (a dozen commands with a reply, in the
pin): priced once, as the log's first step sent them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

# the pin's framing, as logs show it: a set_tensor sends its tensor's header before its data; a
# get_tensor sends a tensor and a range, and its reply is the data after a size; graph_recompute
# sends the command alone
SET_FRAME = 314
GET_SENT = 321
GET_FRAME = 8
RECOMPUTE_SENT = 13
# upload commands at least this big are timed against the rate (the client's send buffer is 256
# KiB at most in tests/helpers/netsim.py; bigger ones drain at the link's rate)
BIG = 1 << 19
# commands the server answers at once, without moving data: their time is the round trip
QUICK = ("get_alloc_size", "get_alignment", "get_max_size", "get_device_memory", "buffer_get_base")
# bytes per node of a serialized graph, where no log sent one (the pin's rpc_tensor is 296 bytes;
# a node also carries its sources' ids and the tensors it reads)
DEFAULT_NODE_BYTES = 400.0


@dataclass(frozen=True)
class Link:
    """One RPC connection: its round trip (ns) and time per byte (ns)."""

    rtt_ns: float
    ns_per_byte: float

    def time(self, n_bytes: float, round_trips: int = 0) -> float:
        return round_trips * self.rtt_ns + n_bytes * self.ns_per_byte

    @property
    def rate_bits(self) -> float:
        return 8e9 / self.ns_per_byte if self.ns_per_byte > 0 else float("inf")


@dataclass
class NetCosts:
    """Per RPC device, its link; the bytes of a serialized graph per node."""

    links: dict[str, Link] = field(default_factory=dict)
    node_bytes: float = DEFAULT_NODE_BYTES
    # the link of a device no log measured, where a rate and a round trip were both given
    given: Link | None = None
    # per device, the commands a session's first step sends besides its tensors and graphs (the
    # compute buffers' allocation: get_alloc_size, buffer_get_base...): round trips, bytes
    setup: dict[str, tuple[float, float]] = field(default_factory=dict)

    def setup_ns(self) -> float:
        """The first step's setup commands at the links' prices (module docstring)."""
        total = 0.0
        for dev, (trips, n_bytes) in self.setup.items():
            link = self.link(dev)
            if link is not None:
                total += trips * link.rtt_ns + n_bytes * link.ns_per_byte
        return total

    def link(self, device: str) -> Link | None:
        return self.links.get(device, self.given)

    def with_link(self, rate_bits: float | None, rtt_ns: float | None) -> NetCosts:
        """The same devices on another link: ``rate_bits`` (bits/s) and ``rtt_ns``, each where
        given (the log's own otherwise)."""
        out = {}
        for dev, link in self.links.items():
            if rate_bits is not None:
                link = replace(link, ns_per_byte=8e9 / rate_bits)
            if rtt_ns is not None:
                link = replace(link, rtt_ns=rtt_ns)
            out[dev] = link
        given = None
        if rate_bits is not None and rtt_ns is not None:
            given = Link(rtt_ns=rtt_ns, ns_per_byte=8e9 / rate_bits)
        return NetCosts(links=out, node_bytes=self.node_bytes, given=given, setup=self.setup)


def is_rpc_log(sf: Any) -> bool:
    """Whether a log's steps sent commands to an RPC server (its time per token is then its
    window, ``token_time.token_ns``: llama_decode returns before the outputs are read)."""
    tr = getattr(sf, "transfers", None)
    return tr is not None and not tr.empty and bool((tr["phase"].astype(str) == "step").any())


def fit_link(sf: Any, device: str) -> Link | None:
    """A device's link from one log's commands (module docstring), or None without the
    commands to measure it."""
    tr = sf.transfers
    mine = tr[tr["device"].astype(str) == device]
    big = mine[(mine["cmd"].astype(str) == "set_tensor") & (mine["sent"] >= BIG)]
    big = big[big["dur_ns"] > 0]
    if big.empty:
        return None
    per_byte = float(np.median(big["dur_ns"].to_numpy(float) / big["sent"].to_numpy(float)))
    quick = mine[mine["cmd"].astype(str).isin(QUICK) & (mine["recv"] > 0)]
    if not quick.empty:
        rtt = float(np.median(quick["dur_ns"].to_numpy(float)))
    else:
        rem = getattr(sf, "remote", None)
        rows = rem[rem["device"].astype(str) == device] if rem is not None else None
        if rows is None or rows.empty:
            return None
        rtt = 2.0 * float(np.median(rows["one_way_ns"].to_numpy(float)))
    return Link(rtt_ns=rtt, ns_per_byte=per_byte)


def graph_node_bytes(sf: Any) -> float | None:
    """The bytes a log's graph_compute commands sent per node of the splits they sent (None
    without one)."""
    tr, sp = sf.transfers, getattr(sf, "splits", None)
    if sp is None or sp.empty:
        return None
    sends = tr[(tr["cmd"].astype(str) == "graph_compute") & (tr["phase"].astype(str) == "step")]
    sent = nodes = 0.0
    for (step, dev), rows in sends.groupby(["step", "device"], observed=True):
        mine = sp[(sp["step"] == step) & (sp["device"].astype(str) == str(dev))]
        n = float((mine["node_end"] - mine["node_start"]).sum())
        if n > 0:
            sent += float(rows["sent"].sum())
            nodes += n
    return sent / nodes if nodes > 0 else None


# what a step sends to compute: its tensors' data, its graphs, its outputs read back
STEP_COMMANDS = ("set_tensor", "get_tensor", "copy_tensor", "graph_compute", "graph_recompute")


def first_step_setup(sf: Any) -> dict[str, tuple[float, float]]:
    """Per device, the round trips and bytes of the commands a log's first step sent besides
    ``STEP_COMMANDS`` (the compute buffers it allocated)."""
    tr = sf.transfers
    steps = tr[(tr["phase"].astype(str) == "step") & tr["step"].notna()]
    if steps.empty:
        return {}
    first = steps[steps["step"] == steps["step"].min()]
    other = first[~first["cmd"].astype(str).isin(STEP_COMMANDS)]
    out = {}
    for dev, rows in other.groupby("device", observed=True):
        out[str(dev)] = (
            float((rows["recv"] > 0).sum()),
            float((rows["sent"] + rows["recv"]).sum()),
        )
    return out


def fit(sessions: Iterable[Any]) -> NetCosts:
    """The links of the sessions' RPC devices (the median over logs where several have one)."""
    per: dict[str, list[Link]] = {}
    sizes: list[float] = []
    setup: dict[str, tuple[float, float]] = {}
    for sf in sessions:
        if not is_rpc_log(sf):
            continue
        for dev, v in first_step_setup(sf).items():
            setup.setdefault(dev, v)
        devs = sf.devices
        for dev in devs.loc[devs["backend"].astype(str) == "RPC", "device"].astype(str):
            link = fit_link(sf, dev)
            if link is not None:
                per.setdefault(dev, []).append(link)
        nb = graph_node_bytes(sf)
        if nb:
            sizes.append(nb)
    out = NetCosts(node_bytes=float(np.median(sizes)) if sizes else DEFAULT_NODE_BYTES, setup=setup)
    for dev, links in per.items():
        out.links[dev] = Link(
            rtt_ns=float(np.median([x.rtt_ns for x in links])),
            ns_per_byte=float(np.median([x.ns_per_byte for x in links])),
        )
    return out


def step_times(sf: Any) -> dict[int, float]:
    """Per step, the time a token took: llama_decode's (``steps.dur_ns``), or on a log with RPC
    commands in its steps the step's window (``token_time.token_ns``: until its outputs were
    read)."""
    steps = sf.steps
    out = {int(s): float(d) for s, d in zip(steps["step"], steps["dur_ns"], strict=True)}
    if is_rpc_log(sf):
        tt = sf.token_time
        tt = tt[tt["step"].notna()]
        for s, d in zip(tt["step"], tt["token_ns"], strict=True):
            out[int(s)] = float(d)
    return out


def parse_rate(text: str) -> float:
    """Bits per second from ``100M``, ``1G``, ``2.5Gbit``, ``50mbit``, ``800k`` (ValueError on
    anything else, or a rate that is not positive)."""
    t = text.strip().lower().removesuffix("bit/s").removesuffix("bps").removesuffix("bit")
    scale = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
    mult = 1.0
    if t and t[-1] in scale:
        mult, t = scale[t[-1]], t[:-1]
    value = float(t) * mult  # ValueError on the rest
    if not np.isfinite(value) or value <= 0:
        raise ValueError(text)
    return value


def parse_duration_ns(text: str) -> float:
    """Nanoseconds from ``2ms``, ``500us``, ``0.1s``, ``300ns`` (ValueError on anything else, or a
    negative time; 0 is a link without delay)."""
    t = text.strip().lower()
    for unit, ns in (("ms", 1e6), ("us", 1e3), ("µs", 1e3), ("ns", 1.0), ("s", 1e9)):
        if t.endswith(unit):
            value = float(t[: -len(unit)]) * ns
            break
    else:
        raise ValueError(text)
    if not np.isfinite(value) or value < 0:
        raise ValueError(text)
    return value
