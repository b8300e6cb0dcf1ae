"""Where a compute ran: its splits, copies, device-timed stretches, clocks and remote graphs
(``Placement``, decoded strictly by ``placement``)."""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property
from operator import itemgetter
from typing import Any, NamedTuple

from .fields import DECODED, record_rows, strict_str, uint


class Split(NamedTuple):
    """What ggml's scheduler ran on one device (a ``splits`` row): the device (an index into
    ``session_start.machine.devices``), its graph nodes ``[i_start, i_end)``, and host times
    (absolute ns): when the split began (its input copies first), when its graph was handed to the
    backend, and when the backend returned it."""

    device: int
    i_start: int
    i_end: int
    start: int
    launch: int
    end: int


class Copy(NamedTuple):
    """A tensor the scheduler copied to another device for a split (a ``copies`` row): the split
    (an index into the compute's splits), its node (-1: a weight or input) and name, bytes, the
    source and destination devices, and the host-side time of the copy call (absolute ns)."""

    split: int
    node: int
    name: str
    bytes: int
    src: int
    dst: int
    start: int
    dur: int


class Busy(NamedTuple):
    """A stretch of work a device timed itself (a ``busy`` row; Vulkan: a command buffer, from its
    first command's start to its last's end): the device, absolute start, duration, the split
    whose ops it ran (-1: none, only copies) and how many ops."""

    device: int
    start: int
    dur: int
    split: int
    n_ops: int


class Remote(NamedTuple):
    """A graph a patched RPC server computed and timed itself (a ``remote`` row), placed on this
    log's clock: the split (-1: none matched), the device, the client's send and reply times, the
    server's compute start and end (absolute ns), the one-way network estimate and the placement's
    uncertainty (ns), the server's clock offset, the graph command's bytes and its ops."""

    split: int
    device: int
    send: int
    reply: int
    start: int
    end: int
    one_way: int
    err: int
    clock_offset: int
    bytes: int
    n_ops: int


class Clock(NamedTuple):
    """How a device's own timestamps were put on the host clock (a ``clocks`` row)."""

    device: int
    method: str
    uncertainty: int


class Placement:
    """Where a compute ran, beyond the CPU backend's ops: the scheduler's splits and copies, the
    stretches a device timed itself (``busy``, ``clocks``), the graphs remote servers timed
    (``remote``), and ``wait`` (ns from the last split's return until the backends were
    synchronized; None when the record does not say). Times absolute, in the compute's order.

    A record whose rows are all well-formed keeps them as read (``raw``: splits, copies, busy and
    remote rows, times relative to ``t0``) and makes the ``Split``, ``Copy``, ``Busy`` and
    ``Remote`` tuples only when they are first read: the tables take the raw rows in bulk
    (``analysis.device_rows``), with no tuple per row."""

    def __init__(
        self,
        splits: list[Split] | None = None,
        copies: list[Copy] | None = None,
        busy: list[Busy] | None = None,
        remote: list[Remote] | None = None,
        clocks: list[Clock] | None = None,
        wait: int | None = None,
        *,
        raw: tuple[list[Any], list[Any], list[Any], list[Any]] | None = None,
        t0: int = 0,
    ) -> None:
        self.raw, self.t0 = raw, t0
        self.clocks: list[Clock] = clocks if clocks is not None else []
        self.wait = wait
        if raw is None:  # (the tuples themselves, or none)
            self.splits = splits if splits is not None else []
            self.copies = copies if copies is not None else []
            self.busy = busy if busy is not None else []
            self.remote = remote if remote is not None else []

    # (each made on first read, then an attribute of the instance: the trace writers read them
    # often)
    @cached_property
    def splits(self) -> list[Split]:
        t0 = self.t0
        return [Split(d, i0, i1, t0 + s, t0 + la, t0 + e) for d, i0, i1, s, la, e in self._raw(0)]

    @cached_property
    def copies(self) -> list[Copy]:
        t0 = self.t0
        return [
            Copy(k, node, name, nbytes, src, dst, t0 + s, d)
            for k, node, name, nbytes, src, dst, s, d in self._raw(1)
        ]

    @cached_property
    def busy(self) -> list[Busy]:
        t0 = self.t0
        return [Busy(d, t0 + s, dur, k, n) for d, s, dur, k, n in self._raw(2)]

    @cached_property
    def remote(self) -> list[Remote]:
        t0 = self.t0
        return [
            Remote(k, d, t0 + send, t0 + reply, t0 + s, t0 + e, *rest)
            for k, d, send, reply, s, e, *rest in self._raw(3)
        ]

    def _raw(self, k: int) -> list[Any]:
        return self.raw[k] if self.raw is not None else []

    def bulk(self) -> tuple[tuple[list[Any], list[Any], list[Any], list[Any]], int]:
        """The splits, copies, busy and remote rows as their tuples' fields, and the offset of
        their times: the raw rows and ``t0`` when kept, else the tuples and 0."""
        if self.raw is not None:
            return self.raw, self.t0
        return (self.splits, self.copies, self.busy, self.remote), 0

    def split_keys(self) -> tuple[tuple[int, int, int], ...]:
        """Each split's device and node range (what places an op)."""
        if self.raw is not None:
            return tuple(map(_SPLIT_KEY, self.raw[0]))
        return tuple((s.device, s.i_start, s.i_end) for s in self.splits)

    def __repr__(self) -> str:
        return (
            f"Placement(splits={self.splits!r}, copies={self.copies!r}, busy={self.busy!r}, "
            f"remote={self.remote!r}, clocks={self.clocks!r}, wait={self.wait!r})"
        )


_SPLIT_KEY = itemgetter(0, 1, 2)  # a splits row's device and node range
_PLACE_FIELDS = ("splits", "copies", "busy", "remote", "clocks", "wait")


def _split_ref(v: Any, n_splits: int, none_ok: bool) -> int:
    """An index into the compute's splits (-1 where ``none_ok``)."""
    k = uint(v, -1 if none_ok else 0)
    if k >= n_splits:
        raise ValueError(f"split {k} of {n_splits}")
    return k


def placement(rec: dict[str, Any], t0: int) -> Placement | None:
    """Where a compute ran (``splits``, ``copies``, ``busy``, ``clocks``, ``remote``, ``wait``:
    see docs/schema.md), times made absolute; None for a record with none of them. Strict: a
    device, split or time that is not a plain integer in range raises ValueError or TypeError,
    and the record is skipped like any damaged one. Rows all well-formed are kept as read
    (``Placement.raw``); any other record is read row by row (``_strict``), which raises."""
    pre = rec.get(DECODED)
    if type(pre) is Placement:  # (the forked reader's: ``kept_placement``)
        return pre
    if rec.keys().isdisjoint(_PLACE_FIELDS):
        return None
    return _kept(rec, t0) or _strict(rec, t0)


def kept_placement(rec: dict[str, Any], t0: int) -> Placement | None:
    """``placement`` for a record whose rows are all well-formed; None for any other, and for a
    record with none of them (never raises). What the forked reader decodes on its core."""
    if rec.keys().isdisjoint(_PLACE_FIELDS):
        return None
    return _kept(rec, t0)


def _kept(rec: dict[str, Any], t0: int) -> Placement | None:
    """The ``Placement`` of a record whose rows are all well-formed, its rows kept as read;
    None for any other (never raises: ``_strict`` then says what is wrong, in its order)."""
    get = rec.get
    splits, copies, busy, remote, clocks, wait = (
        get("splits"), get("copies"), get("busy"), get("remote"), get("clocks"), get("wait")
    )  # fmt: skip
    splits = [] if splits is None else splits
    copies = [] if copies is None else copies
    busy = [] if busy is None else busy
    remote = [] if remote is None else remote
    try:
        if not (
            type(splits) is list
            and type(copies) is list
            and type(busy) is list
            and type(remote) is list
            and (wait is None or (type(wait) is int and wait >= 0))
            and _good_splits(splits)
        ):
            return None
        n = len(splits)
        if not (_good_copies(copies, n) and _good_busy(busy, n) and _good_remote(remote, n)):
            return None
        kept: list[Clock] = []
        if clocks is not None:
            if type(clocks) is not list:
                return None
            for d, method, err in clocks:
                if not (
                    type(d) is int and type(method) is str and type(err) is int and d >= 0 and err >= 0
                ):  # fmt: skip
                    return None
                kept.append(Clock(d, method, err))
    except (TypeError, ValueError):  # (a row that is not a list of its width)
        return None
    return Placement(clocks=kept, wait=wait, raw=(splits, copies, busy, remote), t0=t0)


# Rows that are well formed, in one test per kind (the strict reading's common case too, a row
# at a time): every field an int of its range, as the field-by-field reading would take it. A
# loop each, the test written out in it: a call per row cost a third of the reading.


def _good_splits(rows: Iterable[list[Any]]) -> bool:
    for d, i0, i1, s, la, e in rows:
        if not (
            type(d) is int
            and type(i0) is int
            and type(i1) is int
            and type(s) is int
            and type(la) is int
            and type(e) is int
            and d >= 0
            and 0 <= i0 <= i1
            and 0 <= s <= la <= e
        ):
            return False
    return True


def _good_copies(rows: Iterable[list[Any]], n: int) -> bool:
    for k, node, name, nbytes, src, dst, s, d in rows:
        if not (
            type(k) is int
            and type(node) is int
            and type(name) is str
            and type(nbytes) is int
            and type(src) is int
            and type(dst) is int
            and type(s) is int
            and type(d) is int
            and 0 <= k < n
            and node >= -1
            and nbytes >= 0
            and src >= 0
            and dst >= 0
            and s >= 0
            and d >= 0
        ):
            return False
    return True


def _good_busy(rows: Iterable[list[Any]], n: int) -> bool:
    for d, s, dur, k, n_ops in rows:
        if not (
            type(d) is int
            and type(s) is int
            and type(dur) is int
            and type(k) is int
            and type(n_ops) is int
            and d >= 0
            and s >= 0
            and dur >= 0
            and -1 <= k < n
            and n_ops >= 0
        ):
            return False
    return True


def _good_remote(rows: Iterable[list[Any]], n: int) -> bool:
    for k, d, send, reply, s, e, one_way, err, offset, nbytes, n_ops in rows:
        if not (
            type(k) is int
            and type(d) is int
            and type(send) is int
            and type(reply) is int
            and type(s) is int
            and type(e) is int
            and type(one_way) is int
            and type(err) is int
            and type(offset) is int
            and type(nbytes) is int
            and type(n_ops) is int
            and -1 <= k < n
            and d >= 0
            and 0 <= send <= reply
            and 0 <= s <= e
            and one_way >= 0
            and err >= 0
            and offset >= -(1 << 62)
            and nbytes >= 0
            and n_ops >= 0
        ):
            return False
    return True


def _strict(rec: dict[str, Any], t0: int) -> Placement:
    """``placement`` row by row: the well-formed rows at once, the others field by field, for the
    error's words."""
    p = Placement()
    for row in record_rows(rec, "splits", 6):
        d, i0, i1, s, la, e = row
        if _good_splits((row,)):  # (else field by field, for the error's words)
            p.splits.append(Split(d, i0, i1, t0 + s, t0 + la, t0 + e))
            continue
        start, launch, end = t0 + uint(s), t0 + uint(la), t0 + uint(e)
        if not (start <= launch <= end and uint(i0) <= uint(i1)):
            raise ValueError("a split that ends before it starts")
        p.splits.append(Split(uint(d), i0, i1, start, launch, end))
    n = len(p.splits)
    for row in record_rows(rec, "copies", 8):
        k, node, name, nbytes, src, dst, s, d = row
        if _good_copies((row,), n):
            p.copies.append(Copy(k, node, name, nbytes, src, dst, t0 + s, d))
            continue
        p.copies.append(
            Copy(
                _split_ref(k, n, False), uint(node, -1), strict_str(name), uint(nbytes), uint(src),
                uint(dst), t0 + uint(s), uint(d),
            )
        )  # fmt: skip
    for row in record_rows(rec, "busy", 5):
        d, s, dur, k, n_ops = row
        if _good_busy((row,), n):
            p.busy.append(Busy(d, t0 + s, dur, k, n_ops))
            continue
        p.busy.append(Busy(uint(d), t0 + uint(s), uint(dur), _split_ref(k, n, True), uint(n_ops)))
    for d, method, err in record_rows(rec, "clocks", 3):
        p.clocks.append(Clock(uint(d), strict_str(method), uint(err)))
    for row in record_rows(rec, "remote", 11):
        k, d, send, reply, s, e, one_way, err, offset, nbytes, n_ops = row
        if _good_remote((row,), n):
            p.remote.append(
                Remote(k, d, t0 + send, t0 + reply, t0 + s, t0 + e, one_way, err, offset, nbytes, n_ops)
            )  # fmt: skip
            continue
        if uint(s) > uint(e) or uint(send) > uint(reply):
            raise ValueError("a remote graph that ends before it starts")
        p.remote.append(
            Remote(
                _split_ref(k, n, True), uint(d), t0 + send, t0 + reply, t0 + s, t0 + e,
                uint(one_way), uint(err), uint(offset, -(1 << 62)), uint(nbytes), uint(n_ops),
            )
        )  # fmt: skip
    if rec.get("wait") is not None:
        p.wait = uint(rec["wait"])
    return p
