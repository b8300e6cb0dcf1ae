"""The fast Perfetto encoder writes what the reference writer writes.

Both traces are decoded with Perfetto's own protos, compressed bundles inflated and interning
resolved, and compared packet by packet: the same track descriptors in the same places, and the same
events (track, type, timestamp, name, categories, args, counter value) in the same order.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import (
    FIXTURES,
    JSON,
    assert_same_trace,
    fast_trace,
    read_log,
    reference_trace,
    resolved,
    rewrite_log,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from reference.perfetto_writer import write_perfetto

from llamacpp_instr.cli import main
from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.formats.perfetto import write_perfetto_fast
from llamacpp_instr.converters.formats.perfetto import writer as perfetto_writer
from llamacpp_instr.converters.session import fold
from llamacpp_instr.converters.session.fold import iter_events, iter_events_packed
from llamacpp_instr.converters.traces.items import (
    ComputeBatch,
    LayoutStats,
    Sample,
    Selection,
    Slice,
    SliceRows,
)
from llamacpp_instr.converters.traces.layout import layout_bulk
from llamacpp_instr.converters.traces.rounding import round3

REAL_FIXTURES = sorted(FIXTURES.glob("*.log.gz"))


def plain_copy(src: Path, dest_dir: Path) -> Path:
    dest = dest_dir / src.name.removesuffix(".gz")
    with gzip.open(src, "rb") as f:
        dest.write_bytes(f.read())
    return dest


@pytest.mark.fast
@pytest.mark.parametrize("fixture", REAL_FIXTURES, ids=lambda p: p.name)
def test_fixture_logs_same_trace(fixture: Path) -> None:
    res = assert_same_trace(fixture)
    n_ops = sum(1 for r in res if r[0] == "event" and r[5] == ("op",))
    assert n_ops > 0 or "minimal" in fixture.name


@pytest.mark.fast
@pytest.mark.parametrize(
    "sel",
    [
        Selection(layer=1),
        Selection(layer=0, steps=(1, 3)),
        Selection(steps=(1, 3)),
        Selection(steps=(2, 1 << 62)),
        Selection(ops=False),
        Selection(layer=99),
        Selection(flows=True),
        Selection(layer=1, steps=(1, 3), flows=True),
    ],
    ids=[
        "layer",
        "layer+steps",
        "steps",
        "steps-open",
        "no-ops",
        "no-such-layer",
        "flows",
        "flows+layer+steps",
    ],
)
def test_selections_same_trace(sel: Selection) -> None:
    assert_same_trace(FIXTURES / "tiny-llama-detailed.log.gz", sel)
    assert_same_trace(FIXTURES / "tiny-qwen2-detailed-ubatch.log.gz", sel)


@pytest.mark.fast
def test_verbose_log_same_trace() -> None:
    res = assert_same_trace(FIXTURES / "tiny-llama-verbose.log.gz")
    tracks = [r[1]["name"] for r in res if r[0] == "track"]
    assert any(t.startswith("thread ") for t in tracks)


def repeat_steps(src: Path, dest: Path, n: int, edit: Any = None) -> Path:
    """A longer log: the source's first steps, then its last generation step ``n`` times more
    (renumbered, later in time), as bench/convert.py makes big logs; ``edit(k, records)`` may
    change the records of repeat k."""
    recs = [json.loads(line) for line in gzip.open(src, "rt", encoding="utf-8")]
    last = max(r["step"] for r in recs if r["type"] == "step_begin")
    group = [r for r in recs if r.get("step") == last and r["type"] != "graph"]
    end = [r for r in recs if r["type"] == "session_end"]
    out = [r for r in recs if r["type"] != "session_end"]
    t0 = min(r["ts"] for r in group)
    span = max(r["ts"] for r in recs) - t0 + 1000
    for k in range(n):
        copy = json.loads(json.dumps(group))
        for r in copy:
            r["step"] = last + 1 + k
            for f in ("ts", "t_start"):
                if f in r:
                    r[f] += span * (k + 1)
        out += edit(k, copy) if edit else copy
    out += [dict(r, ts=r["ts"] + span * (n + 1)) for r in end]
    dest.write_text("".join(json.dumps(r) + "\n" for r in out))
    return dest


@pytest.mark.fast
@pytest.mark.parametrize(
    "fixture", ["tiny-llama-rpc2-detailed.log.gz", "tiny-llama-vulkan-partial-detailed.log.gz"]
)
def test_device_computes_of_one_graph_on_other_ubatches(tmp_path: Path, fixture: str) -> None:
    """A graph computed again on another ubatch (a long prompt, ubatch after ubatch): each
    device's part of it is named and described for its own ubatch, not written from the
    template of the first (whose slice args were not in its key)."""

    def edit(k: int, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for r in recs:
            if r["type"] == "compute":
                r["ubatch"] = k % 2
        return recs

    log = repeat_steps(FIXTURES / fixture, tmp_path / "r.log", 12, edit)
    res = assert_same_trace(log)
    names = {r[4] for r in res if r[0] == "event" and r[5] == ("device",)}
    assert names == {"compute ubatch 0", "compute ubatch 1"}


@pytest.mark.fast
def test_bulk_paths_are_taken(tmp_path: Path) -> None:
    """A detailed log's computes are packed, and all but the first few come from templates:
    else this module would test little that is new."""
    log = repeat_steps(FIXTURES / "tiny-qwen2-detailed-ubatch.log.gz", tmp_path / "r.log", 12)
    items = list(layout_bulk(iter_events_packed(log), Selection(), LayoutStats()))
    batches = [it for it in items if isinstance(it, ComputeBatch)]
    assert any(b.ops is not None for b in batches)
    n_computes = len(batches)
    _, templated = fast_trace(log, flush_rows=1)
    assert n_computes >= 14 and templated >= n_computes - 4
    _, templated = fast_trace(log, flush_rows=300)
    assert templated >= n_computes - 6
    assert_same_trace(log)


@pytest.mark.fast
@pytest.mark.parametrize("name", ["tiny-llama-rpc2-detailed", "tiny-llama-vulkan-partial-detailed"])
def test_device_slices_in_bulk(name: str, tmp_path: Path) -> None:
    """A device log's copies, command buffers, RPC graphs and network commands come as
    ``SliceRows`` items (one per compute and kind), and the trace is the reference's with
    every step in one flush, in a few, or flushed at each step (templated computes among
    them)."""
    log = repeat_steps(FIXTURES / f"{name}.log.gz", tmp_path / "r.log", 12)
    items = list(layout_bulk(iter_events_packed(log), Selection(), LayoutStats()))
    rows = [it for it in items if isinstance(it, SliceRows)]
    kinds = {r.category for r in rows}
    assert "copy" in kinds and ("busy" in kinds or "transfer" in kinds), kinds
    n_rows = sum(len(r.ts) for r in rows)
    assert n_rows > 3 * len(rows)  # several slices per item
    loose = [it for it in items if isinstance(it, Slice) and it.category in kinds]
    assert not loose
    assert_same_trace(log)


_ARG_VALUES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.integers(0, 2**40),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.5]),
    st.text(max_size=6),
)


# flow ids a slice starts or ends (a fixed64 each)
_FLOWS = st.lists(st.integers(0, 2**64 - 1), max_size=2).map(tuple)


@pytest.mark.fast
@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    slices=st.lists(
        st.tuples(
            st.sampled_from([7, 2**40 + 3, 5]),
            st.sampled_from(["copy", "a", "b → c"]),
            st.sampled_from(["copy", "busy", "transfer"]),
            st.sampled_from(["x", "y", "z"]).flatmap(
                lambda first: st.dictionaries(st.sampled_from(["x", "y", "z", "w"]), _ARG_VALUES)
            ),
            _FLOWS,
            _FLOWS,
        ),
        min_size=1,
        max_size=30,
    )
)
def test_begins_in_bulk_as_one_by_one(slices: list[tuple[Any, ...]]) -> None:
    """Slice begins encoded by columns at the flush (``begins``) are the bytes the per-slice
    encoder makes (``EventFields.begin``), whatever the args' values and types and the flows
    the slices start and end, and intern the same strings in the same order."""
    from llamacpp_instr.converters.formats.perfetto.begins import Begins
    from llamacpp_instr.converters.formats.perfetto.events import EventFields
    from llamacpp_instr.converters.formats.perfetto.packets import Interner

    one, bulk = Interner(), Interner()
    events = EventFields(one)
    want = [events.begin(Slice(t, n, 0, 1, 0, c, a, fo, fi)) for t, n, c, a, fo, fi in slices]
    begins = Begins(bulk)

    small: list[tuple[Any, ...]] = []
    for t, n, c, a, fo, fi in slices:
        begins.note(small, len(small), t, n, c, a, fo, fi)
        small.append((0, 1, 0, len(small), b"", -1))
    assert bulk.pending == one.pending
    begins.encode()
    assert [r[4] for r in small] == want


_FEW_VALUES = st.sampled_from([1, True, None, "a", "b", 0, False, "1", 2**40])


@pytest.mark.fast
@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    flushes=st.lists(
        st.lists(
            st.tuples(
                st.sampled_from([7, 5]),
                st.sampled_from(["copy", "a"]),
                st.sampled_from(["copy", "busy"]),
                st.sampled_from(["x", "y"]).flatmap(
                    lambda first: st.fixed_dictionaries({first: _FEW_VALUES, "z": _FEW_VALUES})
                ),
            ),
            min_size=1,
            max_size=12,
        ),
        min_size=2,
        max_size=5,
    ),
    cache_max=st.sampled_from([2, 3, 4096]),
)
def test_begins_cached_across_flushes(flushes: list[list[tuple[Any, ...]]], cache_max: int) -> None:
    """The encodings ``Begins`` keeps from one flush to the next (a category's track and name
    heads, an arg's values by name, type and value) give every flush the bytes the per-slice
    encoder makes: the same values under other names, categories or types (1 and True, "1")
    are not taken for each other, nor is anything lost when a cache starts over."""
    from llamacpp_instr.converters.formats.perfetto import begins as begins_mod
    from llamacpp_instr.converters.formats.perfetto.events import EventFields
    from llamacpp_instr.converters.formats.perfetto.packets import Interner

    one, bulk = Interner(), Interner()
    begins = begins_mod.Begins(bulk)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(begins_mod, "CACHE_MAX", cache_max)
        _begins_as_one_by_one(flushes, begins, EventFields(one))
    assert bulk.pending == one.pending
    assert begins.cache  # (the flushes went through the caches)


def _begins_as_one_by_one(
    flushes: list[list[tuple[Any, ...]]], begins: Any, events: Any
) -> set[bytes]:
    """Each flush's slices (track, name, category, args) noted and encoded by ``begins``,
    asserted equal to ``events.begin``'s one by one; the begins seen."""
    seen: set[bytes] = set()
    for slices in flushes:
        want = [events.begin(Slice(t, n, 0, 1, 0, c, a, (), ())) for t, n, c, a in slices]
        small: list[tuple[Any, ...]] = []
        for t, n, c, a in slices:
            begins.note(small, len(small), t, n, c, a)
            small.append((0, 1, 0, len(small), b"", -1))
        begins.encode()
        assert [r[4] for r in small] == want
        seen.update(want)
    return seen


@pytest.mark.fast
def test_begins_cache_keeps_types_and_names_apart() -> None:
    """Values equal in Python but encoded otherwise (1, True; the same string under two arg
    names; the same track and name in two categories), each in a later flush than the first:
    the cache gives each its own bytes."""
    from llamacpp_instr.converters.formats.perfetto.begins import Begins
    from llamacpp_instr.converters.formats.perfetto.events import EventFields
    from llamacpp_instr.converters.formats.perfetto.packets import Interner

    flushes = [
        [(7, "n", "c", {"x": True, "s": "a"}), (7, "n", "c", {"x": None, "s": "b"})],
        [(7, "n", "d", {"x": 1, "s": "b"}), (5, "n", "d", {"x": None, "s": "a"})],
        [(7, "n", "c", {"x": None, "t": "a"}), (7, "n", "c", {"x": 1, "t": "b"})],
    ]
    seen = _begins_as_one_by_one(flushes, Begins(Interner()), EventFields(Interner()))
    assert len(seen) == 6  # (every begin differs from every other)


@pytest.mark.fast
@pytest.mark.parametrize(
    "sel",
    [Selection(layer=1), Selection(ops=False), Selection(steps=(3, 9))],
    ids=["layer", "no-ops", "steps"],
)
def test_templates_with_selections(sel: Selection, tmp_path: Path) -> None:
    log = repeat_steps(FIXTURES / "tiny-llama-detailed.log.gz", tmp_path / "r.log", 10)
    assert fast_trace(log, sel, flush_rows=1)[1] >= 4
    assert_same_trace(log, sel)


@pytest.mark.fast
def test_computes_unlike_their_template(tmp_path: Path) -> None:
    """Repeats whose rows sort differently (zero-length ops, equal timestamps, ops out of
    order) or whose timestamps change length: encoded by the general path, still the same."""

    def edit(k: int, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        c = next(r for r in recs if r["type"] == "compute")
        ops = c["ops"]
        if k == 4:
            ops[3][2] = 0
        elif k == 5:
            ops[6][1] = ops[5][1]
        elif k == 6:
            ops[8][1], ops[9][1] = ops[9][1], ops[8][1]
        elif k == 7:
            c["layers"][1][2] = 0  # a zero-length layer
        elif k == 8:  # timestamps a byte longer as varints
            for r in recs:
                for f in ("ts", "t_start"):
                    if f in r:
                        r[f] += 1 << 42
        return recs

    log = repeat_steps(FIXTURES / "tiny-llama-detailed.log.gz", tmp_path / "r.log", 14, edit)
    assert fast_trace(log, flush_rows=1)[1] >= 4
    assert_same_trace(log)


@pytest.mark.fast
def test_several_sessions_same_trace(tmp_path: Path) -> None:
    a = plain_copy(FIXTURES / "tiny-llama-detailed.log.gz", tmp_path)
    b = plain_copy(FIXTURES / "tiny-qwen2-detailed-ubatch.log.gz", tmp_path)
    both = tmp_path / "both.log"
    both.write_bytes(a.read_bytes() + b.read_bytes())
    res = assert_same_trace(both)
    assert sum(1 for r in res if r[0] == "track" and "process" in r[1]) == 2


def per_op_decoded(log: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The t_start of each compute record with ops that the bulk fold left to the per-op decoder
    (``decode_compute``; the bulk path calls it for the compute without its ops)."""
    seen: list[int] = []
    real = fold.decode_compute

    def spy(rec: dict[str, Any], graph: Any, *more: Any) -> Any:
        if rec.get("ops"):
            seen.append(rec["t_start"])
        return real(rec, graph, *more)

    with monkeypatch.context() as m:
        m.setattr(fold, "decode_compute", spy)
        steps = [ev for ev in iter_events_packed(log, fork=False) if hasattr(ev, "step")]
    assert steps
    return seen


@pytest.mark.fast
def test_records_left_to_the_per_op_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records that the per-op reader skips or reads in part are left to it; values that it
    converts with int() are converted the same in bulk."""
    src = FIXTURES / "tiny-llama-detailed.log.gz"

    def edit(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        c = [r for r in recs if r["type"] == "compute"]
        assert len(c) >= 4 and all(len(x["ops"]) > 20 for x in c)
        c[0]["ops"][0][1] = -5  # negative offset: the per-op reader skips the record
        c[1]["ops"][0][0] = 10**6  # a node outside the graph: that op is dropped
        c[2]["ops"][2][2] = 7.5  # a float duration: int() makes it 7, in bulk too
        c[2]["ops"][3][1] = " 12 "  # a string offset: int() reads it
        c[2]["ops"][4][0] = True  # a bool node index: 1
        c[3]["ops"][3] = c[3]["ops"][3][:3] + [[0, 10**6]]  # fused, out of range: dropped
        return recs

    log = rewrite_log(src, tmp_path / "odd.log", edit)
    assert_same_trace(log)
    starts = [r["t_start"] for r in read_log(log) if r["type"] == "compute"]
    # the first is skipped, the next and the last read op by op; int() values read in bulk
    assert per_op_decoded(log, monkeypatch) == [starts[0], starts[1], starts[3]]


@pytest.mark.fast
@pytest.mark.parametrize("flush_rows", [1, perfetto_writer.FLUSH_ROWS])
def test_odd_values_in_packed_computes(
    flush_rows: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(perfetto_writer, "FLUSH_ROWS", flush_rows)  # 1: each step on its own
    src = FIXTURES / "tiny-llama-detailed.log.gz"

    def edit(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        c = [r for r in recs if r["type"] == "compute"]
        ops = c[1]["ops"]
        ops[4] = ops[4][:3] + [[1, 2]]  # a fused op
        ops[5][2] = 10**16  # a duration beyond 2**53: rates computed by Python
        ops[6][2] = 3  # tiny duration: large rates
        ops[8][1] = ops[7][1]  # equal starts: order and nesting at equal times
        ops[9][2] = 0  # zero-length ops, one starting where another does
        ops[10][1] = ops[9][1]
        ops[11][2] = 0
        ends = [r for r in recs if r["type"] == "step_end"]
        ends[-1]["t_start"] = 2**63 + 5  # beyond int64: that batch is encoded row by row
        return recs

    log = rewrite_log(src, tmp_path / "odd.log", edit)
    assert_same_trace(log)
    assert per_op_decoded(log, monkeypatch) == []  # every compute read in bulk


@pytest.mark.fast
def test_log_cut_short_same_trace(tmp_path: Path) -> None:
    """No session_end, the last step open: closed at the last timestamp by both readers."""

    def edit(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        cut = max(i for i, r in enumerate(recs) if r["type"] == "step_end")
        return recs[:cut]

    log = rewrite_log(FIXTURES / "tiny-qwen2-detailed-ubatch.log.gz", tmp_path / "cut.log", edit)
    assert_same_trace(log)


@pytest.mark.fast
def test_first_packet_an_event() -> None:
    """Never from a layout (tracks come first), but the flags must still be right."""
    items = [Slice(7, "x", 10, 5, 0, "step", {"a": 1}), Sample(8, 12, 1.5)]
    ref, got = io.BytesIO(), io.BytesIO()
    write_perfetto(items, ref)
    write_perfetto_fast(items, got)
    want = pb.Trace.FromString(ref.getvalue()).packet
    have = pb.Trace.FromString(got.getvalue()).packet
    assert [p.sequence_flags for p in have] == [p.sequence_flags for p in want] == [3, 2, 2]
    assert [p.timestamp for p in have] == [p.timestamp for p in want]


@pytest.mark.fast
def test_tensor_stats_unpack(tmp_path: Path) -> None:
    """Stats arriving for a detailed log's packed compute attach as the per-op reader does."""
    src = FIXTURES / "tiny-llama-detailed.log.gz"

    def edit(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for r in recs:
            out.append(r)
            if r["type"] == "compute" and r["step"] == 1:
                nodes = [o[0] for o in r["ops"][:4]]
                out.append(
                    {
                        "type": "tensor_stats",
                        "ts": r["ts"],
                        "sid": r["sid"],
                        "ctx": r["ctx"],
                        "step": r["step"],
                        "ubatch": r["ubatch"],
                        "stats": [[i, -1.5, 2.5, 0.25, 1.0, 0, 0] for i in nodes],
                    }
                )
        return out

    log = rewrite_log(src, tmp_path / "stats.log", edit)
    res = assert_same_trace(log)
    assert any(any(k == "out_mean" for k, _ in r[6]) for r in res if r[0] == "event")


@pytest.mark.fast
def test_rates_round_like_python() -> None:
    """The vectorized round(x, 3) is Python's, including values at rounding boundaries."""
    import numpy as np

    rng = np.random.default_rng(7)
    flops = np.concatenate(
        [rng.integers(0, 10**12, 20000), np.array([5, 15, 25, 125, 1, 2**53, 0, 62500])]
    )
    durs = np.concatenate([rng.integers(1, 10**7, 20000), np.array([10, 10, 10, 1000, 3, 1, 1, 1])])
    x = flops / durs
    got = round3(x)
    checked = 0
    for v, g in zip(x.tolist(), got.tolist(), strict=True):
        if not math.isnan(g):  # NaN: the writer asks Python
            assert g == round(v, 3)
            checked += 1
    assert checked > 19_000  # a round3 that gave up (NaN) everywhere would check nothing


@pytest.mark.fast
def test_cli_writes_the_fast_trace(tmp_path: Path) -> None:
    log = plain_copy(FIXTURES / "tiny-llama-detailed.log.gz", tmp_path)
    out = tmp_path / "t.pftrace"
    r = CliRunner().invoke(main, ["to-perfetto", str(log), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert resolved(out.read_bytes()) == resolved(reference_trace(log))
    assert resolved(out.read_bytes()) == resolved(fast_trace(log, compress=False)[0])


@pytest.mark.fast
def test_auto_compression_by_size(monkeypatch: pytest.MonkeyPatch) -> None:
    log = FIXTURES / "tiny-llama-detailed.log.gz"
    plain = fast_trace(log)[0]
    assert not any(p.HasField("compressed_packets") for p in pb.Trace.FromString(plain).packet)
    monkeypatch.setattr(perfetto_writer, "AUTO_COMPRESS", 1000)
    monkeypatch.setattr(perfetto_writer, "CHUNK", 4096)
    monkeypatch.setattr(perfetto_writer, "FLUSH_ROWS", 64)
    small = fast_trace(log)[0]
    outer = pb.Trace.FromString(small).packet
    assert len(outer) > 1 and all(p.HasField("compressed_packets") for p in outer)
    assert resolved(small) == resolved(plain) and len(small) < len(plain) / 3


def test_real_smollm2_detailed_log(smollm2_detailed: Any, tmp_path: Path) -> None:
    log = tmp_path / "smollm2.log"
    log.write_bytes(smollm2_detailed.path.read_bytes())
    res = assert_same_trace(log)
    assert sum(1 for r in res if r[0] == "event" and r[5] == ("op",)) == sum(
        len(c["ops"]) for c in smollm2_detailed.of("compute")
    )
    assert_same_trace(log, Selection(layer=3, steps=(2, 9)))


def test_real_smollm2_verbose_log(smollm2_verbose: Any, tmp_path: Path) -> None:
    log = tmp_path / "smollm2-verbose.log"
    log.write_bytes(smollm2_verbose.path.read_bytes())
    res = assert_same_trace(log)
    assert any(r[1]["name"].startswith("thread ") for r in res if r[0] == "track")


# ------------------------------------------------------------------ damaged logs, fuzzed

_RECS = [
    json.loads(line)
    for name in ("tiny-llama-detailed.log.gz", "tiny-llama-verbose.log.gz")
    for line in gzip.open(FIXTURES / name, "rt", encoding="utf-8")
]


def _outcome(write: Any) -> Any:
    try:
        return resolved(write())
    except (ValueError, OverflowError, UserError) as exc:
        return type(exc)  # the same failure (a value the protobuf encoding cannot hold)


@pytest.mark.fast
@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")),
    deadline=None,
    derandomize="FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    edits=st.lists(
        st.tuples(
            st.integers(0, len(_RECS) - 1),
            st.text(max_size=12),
            JSON,
            st.integers(0, 2000),
        ),
        min_size=1,
        max_size=4,
    ),
    pick_existing=st.booleans(),
)
def test_fuzz_same_trace(
    edits: list[tuple[int, str, Any, int]], pick_existing: bool, tmp_path: Path
) -> None:
    """Records with wrong types or values (also inside op entries): the same trace, or the
    same failure, from both encoders."""
    recs = json.loads(json.dumps(_RECS))
    for i, key, value, pos in edits:
        r = recs[i]
        if r.get("ops") and pos % 3 == 0:  # somewhere in an op entry
            entry = r["ops"][pos % len(r["ops"])]
            entry[pos % len(entry)] = value
            continue
        if pick_existing and r:
            key = sorted(r)[len(key) % len(r)]
        r[key] = value
    log = tmp_path / "fuzz.log"
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    try:
        list(iter_events(log))
    except UserError:
        return
    want = _outcome(lambda: reference_trace(log))
    for flush_rows in (1, None):
        got = _outcome(lambda fr=flush_rows: fast_trace(log, compress=False, flush_rows=fr)[0])
        assert got == want
