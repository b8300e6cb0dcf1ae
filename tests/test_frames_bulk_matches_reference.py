"""`load_session` in bulk: the same frames as the per-op reference (``reference.frames``, the
implementation before the bulk one) on every kind of log: the fixtures, real logs, a bigger
synthetic log, and damaged, odd and fuzzed ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from helpers.support import (
    FIXTURES,
    FUZZ_DERANDOMIZE,
    FUZZ_EXAMPLES,
    JSON,
    ODD_OPS,
    REAL_FIXTURES,
    edit_ops,
    plain_copy,
    read_log,
    synthetic_log,
    write_log,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference.frames import reference_load_sessions

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.analysis.frames import SessionFrames, load_session, load_sessions
from llamacpp_instr.converters.reading.decode import computes
from llamacpp_instr.converters.reading.decode.graphs import Graph
from llamacpp_instr.converters.reading.decode.sessions import StepDone
from llamacpp_instr.converters.session.fold import iter_events

# ------------------------------------------------------------------------------ comparison


def assert_same_frames(ref: list[SessionFrames], new: list[SessionFrames]) -> None:
    assert len(ref) == len(new)
    for a, b in zip(ref, new, strict=True):
        for name in SessionFrames.TABLES + SessionFrames.MEDIA_TABLES:
            x, y = getattr(a, name), getattr(b, name)
            assert list(x.columns) == list(y.columns), name
            assert list(x.dtypes) == list(y.dtypes), name  # categoricals: categories and order
            pd.testing.assert_frame_equal(x, y, check_exact=True, obj=name)
        assert a.graphs.keys() == b.graphs.keys()
        assert all(_table(a.graphs[k]) == _table(b.graphs[k]) for k in a.graphs)
        assert a.info == b.info
        assert a.report == b.report


def _table(g: Graph) -> tuple[Any, ...]:
    """What a graph says (graphs are equal only to themselves)."""
    return g.ctx, g.id, g.n_tokens, g.nodes


def assert_same_outcome(path: Path) -> None:
    """Both implementations give equal frames, or both raise the same kind of error."""
    try:
        ref = reference_load_sessions(path)
    except Exception as exc:  # noqa: BLE001 - whatever the reference raises, so must the new one
        # (a value beyond 64 bits: the tables say so in one line where the reference overflowed)
        with pytest.raises(UserError if isinstance(exc, OverflowError) else type(exc)):
            load_sessions(path)
        return
    assert_same_frames(ref, load_sessions(path))


# ------------------------------------------------------------------------------ the tests


@pytest.mark.fast
@pytest.mark.parametrize("fixture", REAL_FIXTURES, ids=lambda p: p.name)
def test_same_frames_as_reference_on_fixtures(fixture: Path, tmp_path: Path) -> None:
    assert_same_frames(reference_load_sessions(fixture), load_sessions(fixture))  # gzip
    plain = plain_copy(fixture, tmp_path)
    assert_same_frames(reference_load_sessions(plain), load_sessions(plain))


def test_same_frames_as_reference_on_real_logs(smollm2_detailed: Any, smollm2_verbose: Any) -> None:
    for log in (smollm2_detailed.path, smollm2_verbose.path):
        ref = reference_load_sessions(log)
        new = load_sessions(log)
        assert len(new[0].ops) > 1000
        assert_same_frames(ref, new)


@pytest.mark.fast
def test_same_frames_as_reference_on_a_bigger_log(tmp_path: Path) -> None:
    log = synthetic_log(tmp_path, 300)
    ref, new = reference_load_sessions(log), load_sessions(log)
    assert len(new) == 2 and len(new[0].ops) > 10_000
    assert_same_frames(ref, new)
    assert load_session(log, "00000000000000b2").info.sid == "00000000000000b2"


@pytest.mark.fast
@pytest.mark.parametrize("fixture", REAL_FIXTURES, ids=lambda p: p.name)
def test_ops_recomputed_from_the_raw_json(fixture: Path) -> None:
    """The ops table, column by column, from the NDJSON read with the json module alone (an
    encoder's encodes, an image's or a sound's, in ``encode_ops`` the same way)."""
    recs = read_log(fixture)
    graphs = {(r["ctx"], r["graph"]): r["nodes"] for r in recs if r["type"] == "graph"}
    encodes = {r["step"] for r in recs if r["type"] == "step_begin" and r["kind"] == "encode"}
    rows: dict[bool, list[tuple[Any, ...]]] = {False: [], True: []}
    for c in recs:
        if c["type"] != "compute" or "ops" not in c:
            continue
        nodes = graphs[(c["ctx"], c["graph"])]
        for e in c.get("ops", []):
            n = nodes[e[0]]
            fused = e[3] if len(e) > 3 else []
            label = f"{n['op']}:{n['sub']}" if n.get("sub") else n["op"]
            weight = next((s for s in n["src"] if s.get("kind") == "weight"), None)
            rows[c["step"] in encodes].append(
                (
                    c["step"], c["ubatch"], c["graph"], n["i"], n["name"], n["op"], label,
                    -1 if n["layer"] is None else n["layer"], c["t_start"] + e[1], e[2],
                    len(fused), "x".join(map(str, n["shape"])), n["dtype"],
                    weight["name"] if weight else None,
                )
            )  # fmt: skip
    f = load_session(fixture)
    for ops, want in ((f.ops, rows[False]), (f.encode_ops, rows[True])):
        cols = (
            "step ubatch graph node name op label layer t_start dur_ns n_fused shape dtype weight"
        )
        got = ops[cols.split()].astype(object)
        got["layer"] = ops["layer"].fillna(-1).astype(int)
        got["weight"] = ops["weight"].astype(object).where(ops["weight"].notna(), None)
        assert [tuple(r) for r in got.itertuples(index=False)] == want
        for col in ("t_start", "dur_ns", "est_flops", "est_bytes", "n_fused", "step", "node"):
            assert ops[col].dtype == "int64"
        for col in ("name", "op", "label", "category", "shape", "dtype", "weight", "weight_type"):
            assert isinstance(ops[col].dtype, pd.CategoricalDtype)
            first_seen = list(dict.fromkeys(ops[col].dropna().astype(str)))
            assert list(ops[col].cat.categories) == first_seen


@pytest.mark.fast
def test_no_python_object_per_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """The frames never go through the per-op view of the session model: not for a detailed
    log, nor for a verbose one (thread timings and tensor statistics are columns too)."""

    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("per-op path used")

    monkeypatch.setattr(computes, "OpTiming", boom)
    f = load_session(FIXTURES / "tiny-qwen2-detailed-ubatch.log.gz")
    assert len(f.ops) > 100
    verbose = FIXTURES / "tiny-llama-verbose.log.gz"
    f = load_session(verbose)
    assert len(f.ops) > 100 and len(f.tensor_stats) > 10
    # the patch bites: the per-op view of the same computes makes OpTiming objects
    step = next(ev.step for ev in iter_events(verbose) if isinstance(ev, StepDone))
    assert step.computes[0].op_threads is not None and step.computes[0].op_stats
    with pytest.raises(AssertionError, match="per-op path used"):
        step.computes[0].unpack()


@pytest.mark.fast
@pytest.mark.parametrize(
    "fixture", ["tiny-llama-verbose.log.gz", "tiny-qwen2-detailed-ubatch.log.gz"]
)
@pytest.mark.parametrize("case", sorted(ODD_OPS))
@pytest.mark.parametrize("which", [0, 1])
def test_odd_compute_records_as_reference(
    fixture: str, case: str, which: int, tmp_path: Path
) -> None:
    recs = read_log(FIXTURES / fixture)
    log = write_log(tmp_path / "odd.log", edit_ops(recs, which, ODD_OPS[case]))
    assert_same_outcome(log)


@pytest.mark.fast
def test_damaged_logs_as_reference(tmp_path: Path) -> None:
    recs = read_log(FIXTURES / "tiny-llama-verbose.log.gz")
    lines = [json.dumps(r) for r in recs]
    cases = {
        "cut short": lines[: len(lines) // 2],
        "no session_end": lines[:-1],
        "truncated last line": lines[:-1] + [lines[-1][:20]],
        "garbage line": lines[:5] + ["{nope"] + lines[5:],
        "twice": lines + lines,
        "stats twice": lines[:-2] + [lines[-3]] + lines[-2:],
        "fragment only": lines[3:],
    }
    for name, content in cases.items():
        log = tmp_path / f"{name.replace(' ', '_')}.log"
        log.write_text("\n".join(content) + "\n")
        assert_same_outcome(log)


_VERBOSE = read_log(FIXTURES / "tiny-llama-verbose.log.gz")
_DETAILED = read_log(FIXTURES / "tiny-qwen2-detailed-ubatch.log.gz")


@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=FUZZ_DERANDOMIZE,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    verbose=st.booleans(),
    edits=st.lists(
        st.tuples(
            st.integers(0, 10_000), st.sampled_from(["record", "op", "value"]), st.text(), JSON
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_fuzz_same_outcome_as_reference(
    verbose: bool, edits: list[tuple[int, str, str, Any]], tmp_path: Path
) -> None:
    """Wrong types and values in any record, an op entry or one value of it: the same frames (or
    the same error) as the per-op implementation."""
    recs = [json.loads(json.dumps(r)) for r in (_VERBOSE if verbose else _DETAILED)]
    computes = [r for r in recs if r["type"] == "compute"]
    for pick, where, key, value in edits:
        if where == "record":
            r = recs[pick % len(recs)]
            r[sorted(r)[len(key) % len(r)]] = value
            continue
        c = computes[pick % len(computes)]
        ops = c.get("ops")
        if not isinstance(ops, list) or not ops:
            continue
        k = (pick // 7) % len(ops)
        if where == "op" or not isinstance(ops[k], list) or not ops[k]:
            ops[k] = value
        else:
            ops[k][len(key) % len(ops[k])] = value
    log = tmp_path / "fuzz.log"
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert_same_outcome(log)


def _matmul(recs: list[dict[str, Any]]) -> dict[str, Any]:
    g = next(r for r in recs if r["type"] == "graph")
    return next(n for n in g["nodes"] if n["op"] == "MUL_MAT")


_ODD_GRAPHS: dict[str, Any] = {
    "shape beyond 64 bits": lambda recs: _matmul(recs).__setitem__("shape", [2**40, 2**40]),
    "weight without a name": lambda recs: [
        s.pop("name") for s in _matmul(recs)["src"] if s.get("kind") == "weight"
    ],
    "source node as a float": lambda recs: _matmul(recs)["src"].__setitem__(0, {"node": 1.0}),
    "leaf without a shape": lambda recs: [s.pop("shape") for s in _matmul(recs)["src"][:1]],
    "layer as a string": lambda recs: _matmul(recs).__setitem__("layer", "3"),
    "no graph tables": lambda recs: recs.__setitem__(
        slice(None), [r for r in recs if r["type"] != "graph"]
    ),
}


@pytest.mark.fast
@pytest.mark.parametrize("case", sorted(_ODD_GRAPHS))
def test_odd_graph_tables_as_reference(case: str, tmp_path: Path) -> None:
    recs = read_log(FIXTURES / "tiny-llama-detailed.log.gz")
    _ODD_GRAPHS[case](recs)
    assert_same_outcome(write_log(tmp_path / "odd.log", recs))
