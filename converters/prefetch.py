"""Reading a big log on the other core, for the trace writers.

Turning a log into a trace is two jobs of about equal size: parsing the lines (orjson, then each
compute's ``ops`` list into int64 columns) and encoding the trace. Python runs one of them at a
time, so for a big log a forked process does the first: it reads the records with
``reader.iter_records`` and sends them over a pipe in batches, each compute's ops already as
columns (``PackedOps``) and its layers as ``session.layer_rows`` makes them, while this process
builds and encodes the trace. What it yields, and what ``report`` ends up saying, are exactly what
``iter_records`` would have given (skipped lines in their place); a ``strict`` error is raised
here. Small logs, platforms without ``fork`` and processes already running threads (where forking
is unsafe) read in this process.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import threading
from collections.abc import Iterator
from itertools import chain
from multiprocessing.reduction import ForkingPickler
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from .errors import UserError
from .reader import ReadReport, iter_records
from .session import layer_rows

MIN_BYTES = 8 << 20  # smaller logs are read in this process: a fork would not pay for itself
BATCH = 128  # records per message
FIRST_BATCH = 4  # the first message: the reading side waits for it
AHEAD = 16  # messages the reader may have ready beyond what the pipe holds
_ITEM = (itemgetter(0), itemgetter(1), itemgetter(2))


class PackedOps:
    """A compute record's ``ops`` list as columns: ``arr`` rows (node, start offset, duration),
    each row's ``lo``/``hi``, the fused nodes by op position, and their smallest and largest node
    index. ``to_list()`` gives the list back, for the per-op reader."""

    __slots__ = ("arr", "lo", "hi", "fused", "f_lo", "f_hi")

    def __init__(
        self, arr: Any, fused: dict[int, list[int]], f_lo: int = 0, f_hi: int = -1
    ) -> None:
        self.arr = arr
        self.lo: list[int] = arr.min(axis=1).tolist()
        self.hi: list[int] = arr.max(axis=1).tolist()
        self.fused, self.f_lo, self.f_hi = fused, f_lo, f_hi

    def to_list(self) -> list[list[Any]]:
        ops: list[list[Any]] = self.arr.T.tolist()
        for k, f in self.fused.items():
            ops[k].append(f)
        return ops


def pack_ops(ops: Any, last: dict[int, list[int]] | None = None) -> PackedOps | None:
    """``ops`` (a compute record's list of ``[i, start, dur]`` or ``[i, start, dur, [j, ...]]``)
    as columns, or None if any entry is unusual (the per-op reader then decides). ``last``: the
    fused ops of the graph's previous compute, which every generation step repeats (reused, not
    rebuilt, when they match)."""
    try:
        if not isinstance(ops, list) or not ops:
            return None
        n = len(ops)
        # int64 conversion is int()'s, as the per-op reader's, but fails beyond 64 bits (and on
        # short or odd entries): those records are left to the per-op reader
        arr = np.empty((3, n), dtype=np.int64)
        for k in range(3):
            arr[k] = np.fromiter(map(_ITEM[k], ops), dtype=np.int64, count=n)
        extra = sum(map(len, ops)) - 3 * n  # elements beyond (node, offset, duration)
        if not extra:
            return PackedOps(arr, {})
        if (
            last is not None
            and len(last) == extra
            and all(len(ops[k]) == 4 and ops[k][3] == f for k, f in last.items())
        ):
            fused = last
        else:
            lens = np.fromiter(map(len, ops), dtype=np.int64, count=n)
            pos = np.flatnonzero(lens > 3).tolist()
            lists = [ops[k][3] for k in pos]
            if set(map(type, lists)) != {list} or any(len(ops[k]) != 4 for k in pos):
                return None
            fused = dict(zip(pos, lists, strict=True))
        flat = list(chain.from_iterable(fused.values()))
        if not flat:
            return PackedOps(arr, fused)
        if set(map(type, flat)) != {int}:
            return None
        return PackedOps(arr, fused, min(flat), max(flat))
    except Exception:  # noqa: BLE001 - whatever it is, the per-op reader reports it
        return None


def records(
    path: Path | str, *, strict: bool = False, report: ReadReport | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``reader.iter_records``, in a forked process for a big log (see the module doc): then a
    compute record's ``ops`` may come as ``PackedOps``."""
    rep = report if report is not None else ReadReport()
    try:
        big = Path(path).stat().st_size >= MIN_BYTES
    except OSError:
        big = False  # iter_records says what is wrong
    if not big or not _can_fork():
        yield from iter_records(path, strict=strict, report=rep)
        return
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    _widen(send.fileno())
    proc = ctx.Process(target=_read, args=(send, path, strict), daemon=True)
    proc.start()
    send.close()
    try:
        while True:
            try:
                msg = recv.recv()
            except EOFError:
                raise UserError(f"{path}: the log reader process ended early") from None
            if msg[0] == "batch":
                for n, rec, why in msg[1]:
                    if rec is None:
                        rep.skipped.append((n, why))
                    else:
                        yield n, rec
            elif msg[0] == "end":
                rep.lines, rep.records, rep.replaced_utf8 = msg[1:4]
                rep.unknown_types.update(msg[4])
                return
            else:  # "error": a strict reader's complaint, or what stopped the reader
                raise UserError(msg[1])
    finally:
        recv.close()
        if proc.is_alive():
            proc.terminate()
        proc.join()


def _widen(fd: int) -> None:
    """Let the pipe hold a whole message (Linux: 1 MiB, the unprivileged limit, rather than
    64 KiB): a message then goes in one write, and the reading side does not wait for the
    sending thread to get the GIL back for every 64 KiB of it."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
    except (ImportError, AttributeError, OSError):
        pass  # another platform, or a lower limit: smaller writes, the same messages


def _can_fork() -> bool:
    return (
        "fork" in multiprocessing.get_all_start_methods()
        and threading.active_count() == 1  # forking a threaded process can deadlock the child
        and not os.environ.get("LLAMACPP_INSTR_NO_PREFETCH")
    )


class _Gone(Exception):
    """The reading side has stopped reading (it ended early): the reader stops too."""


class _Sender:
    """Sends the reading process's messages from a thread. A pipe holds 64 KiB, less than one
    message: sending from the parsing loop, the reader could never be more than a message ahead,
    and it stood still through every one of the writer's flushes. From here it parses on while
    up to ``AHEAD`` messages wait (``Connection.recv`` unpickles them as ``send`` would have
    pickled them)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.queue: queue.Queue[Any] = queue.Queue(AHEAD)
        self.failed = False  # the reading side has gone: what is left is dropped
        self.thread = threading.Thread(target=self._run, name="log-reader-send", daemon=True)
        self.thread.start()

    def send(self, msg: tuple[Any, ...]) -> None:
        if self.failed:
            raise _Gone
        self.queue.put(ForkingPickler.dumps(msg))

    def _run(self) -> None:
        while (data := self.queue.get()) is not None:
            if not self.failed:
                try:
                    self.conn.send_bytes(data)
                except BaseException:  # noqa: BLE001 - the parsing loop stops at its next send
                    self.failed = True

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        self.conn.close()


def _read(conn: Any, path: Path | str, strict: bool) -> None:
    """The reading process: records in batches, skipped lines in their place, then the totals."""
    out = _Sender(conn)
    try:
        _read_to(out, path, strict)
    except _Gone:
        pass  # nobody is left to tell
    finally:
        out.close()


def _read_to(out: _Sender, path: Path | str, strict: bool) -> None:
    rep = ReadReport()
    batch: list[tuple[int, Any, str]] = []
    last: dict[tuple[Any, ...], dict[int, list[int]]] = {}  # per graph: the last fused ops
    n_skipped = 0
    size = FIRST_BATCH
    try:
        for n, rec in iter_records(path, strict=strict, report=rep):
            if len(rep.skipped) > n_skipped:
                batch += [(m, None, why) for m, why in rep.skipped[n_skipped:]]
                n_skipped = len(rep.skipped)
            if rec["type"] == "compute":
                key = (rec.get("sid"), rec.get("ctx"), rec.get("graph"))
                packed = pack_ops(rec.get("ops"), last.get(key))
                if packed is not None:
                    rec["ops"] = packed
                    if packed.fused:
                        last[key] = packed.fused
                t0 = rec.get("t_start")
                if type(t0) is int and t0 >= 0:  # what the model's reading would accept
                    rows = layer_rows(rec.get("layers"), t0)
                    if rows is not None:
                        rec["layers"] = rows  # absolute, as session._layers makes them
            batch.append((n, rec, ""))
            if len(batch) >= size:
                out.send(("batch", batch))
                batch = []
                size = BATCH
        batch += [(m, None, why) for m, why in rep.skipped[n_skipped:]]
        out.send(("batch", batch))
        out.send(("end", rep.lines, rep.records, rep.replaced_utf8, dict(rep.unknown_types)))
    except UserError as exc:
        out.send(("batch", batch))
        out.send(("error", str(exc)))
    except _Gone:
        raise
    except BaseException as exc:  # noqa: BLE001 - reported to the reading side, never lost
        out.send(("error", f"{path}: reading failed: {type(exc).__name__}: {exc}"))
