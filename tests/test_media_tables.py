"""Images and sounds read: the ``media`` records, an encoder's encodes (steps of kind ``encode``)
and the decode steps that carry a medium, as the tables hold them, against the records read
with the json module alone (real runs of llama-mtmd-cli: two images through a gemma3 projector,
a sound through a qwen2a one; llama-server answering two requests with an image each)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
from helpers.support import FIXTURES, read_log, record_edits, with_edits, write_log
from hypothesis import HealthCheck, given, settings
from test_frames_bulk_matches_reference import assert_same_outcome

from llamacpp_instr.converters import load_session
from llamacpp_instr.converters.session.fold import load

pytestmark = pytest.mark.fast

IMAGES = FIXTURES / "tiny-llama-gemma3-images-detailed.log.gz"
AUDIO = FIXTURES / "seeds" / "tiny-llama-qwen2a-audio-detailed.log.gz"
SERVER = FIXTURES / "seeds" / "tiny-llama-gemma3-server-detailed.log.gz"
LOGS = [IMAGES, AUDIO]

Records = list[dict[str, Any]]


def _steps(recs: Records) -> dict[int, tuple[dict[str, Any], dict[str, Any], Records]]:
    """Each step's step_begin, step_end and compute records, by step."""
    out: dict[int, tuple[dict[str, Any], dict[str, Any], Records]] = {}
    begins = {r["step"]: r for r in recs if r["type"] == "step_begin"}
    for r in recs:
        if r["type"] == "step_end":
            computes = [c for c in recs if c["type"] == "compute" and c["step"] == r["step"]]
            out[r["step"]] = (begins[r["step"]], r, computes)
    return out


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_the_media_table_is_the_media_records(log: Path) -> None:
    recs = read_log(log)
    media = [r for r in recs if r["type"] == "media"]
    f = load_session(log)
    assert f.report.skipped == [] and len(media) >= 1
    want = [
        (r["id"], r["kind"], r["nx"], r["ny"], r["bytes"], r["hash"], r["slices"], r["tokens"])
        + (r["n_pos"], *r["load"], *r["preprocess"])
        for r in media
    ]
    cols = "id kind nx ny bytes hash slices tokens n_pos t_load load_ns t_preprocess preprocess_ns"
    got = [tuple(x) for x in f.media[cols.split()].astype(object).itertuples(index=False)]
    assert got == want


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_encodes_are_apart_from_the_decode_steps(log: Path) -> None:
    """The steps, layers and ops tables hold the decode steps only; each encode is a row of
    ``encodes``, its spans and ops in ``encode_layers`` and ``encode_ops``."""
    recs = read_log(log)
    steps = _steps(recs)
    encodes = sorted(k for k, (b, _, _) in steps.items() if b["kind"] == "encode")
    decodes = sorted(k for k, (b, _, _) in steps.items() if b["kind"] != "encode")
    assert encodes and decodes
    f = load_session(log)
    assert f.steps["step"].tolist() == decodes
    assert set(f.ops["step"]) <= set(decodes) and set(f.layers["step"]) <= set(decodes)
    assert f.encodes["step"].tolist() == encodes
    assert sorted(set(f.encode_ops["step"])) == encodes
    for k in encodes:
        begin, end, computes = steps[k]
        row = f.encodes[f.encodes["step"] == k].iloc[0]
        assert row["ctx"] == begin["ctx"] and row["n_tokens"] == end["n_tokens"]
        assert row["dur_ns"] == end["dur"] and row["t_start"] == end["t_start"]
        assert row["compute_ns"] == sum(c["dur"] for c in computes)
        assert row["op_ns"] == sum(e[2] for c in computes for e in c["ops"])
        assert row["first"] == begin["first"]
        assert (row["media"], row["slice"]) == tuple(begin["media"][0])
        mine = f.encode_media[f.encode_media["step"] == k]
        want = {m: sum(1 for x, _ in begin["media"] if x == m) for m, _ in begin["media"]}
        assert dict(zip(mine["media"], mine["slices"], strict=True)) == want
        target = begin.get("target")
        assert (None if target is None else [row["target_ctx"], row["target_seq"]]) == target
        assert (row["request"] if isinstance(row["request"], str) else None) == begin.get("request")
        ops = f.encode_ops[f.encode_ops["step"] == k]
        assert sorted(ops["dur_ns"]) == sorted(e[2] for c in computes for e in c["ops"])
        spans = f.encode_layers[f.encode_layers["step"] == k]
        assert sorted(spans["layer"]) == sorted(s[0] for c in computes for s in c["layers"])
    encoder = next(r for r in recs if r["type"] == "context" and r["role"] == "encoder")
    assert set(f.encodes["encoder"].astype(str)) == {encoder["model"]["architecture"]}
    # the encoder's first encode is said once, at the first
    assert f.encodes["first"].tolist() == [True] + [False] * (len(encodes) - 1)


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_a_decode_step_carries_its_medium(log: Path) -> None:
    recs = read_log(log)
    f = load_session(log)
    want = {
        r["step"]: tuple(r["media"])
        for r in recs
        if r["type"] == "step_begin" and r["kind"] != "encode" and "media" in r
    }
    carried = f.steps[f.steps["media"].notna()]
    assert {
        int(s): (int(m), int(k))
        for s, m, k in zip(carried["step"], carried["media"], carried["media_slice"], strict=True)
    } == want
    assert want, "no step decodes a medium"
    # a medium's tokens are decoded by the steps that carry it, no more, no fewer
    for m in f.media.itertuples():
        assert int(carried.loc[carried["media"] == m.id, "n_tokens"].sum()) == m.tokens


def test_the_encoder_context_is_read_with_its_role(tmp_path: Path) -> None:
    """The encoder's ``context`` record is no longer skipped: its role and encoder object."""
    recs = read_log(IMAGES)
    rec = next(r for r in recs if r["type"] == "context")
    (session,) = load(IMAGES)
    got = session.info.contexts[rec["ctx"]]
    assert got["role"] == "encoder" and got["model"] == rec["model"]
    assert got["encoder"] == rec["encoder"]


FORGED: dict[str, Any] = {
    "a medium of kind video": lambda r: r.update(kind="video"),
    "a medium whose hash is short": lambda r: r.update(hash="abc"),
    "a medium of 2**64 pixels": lambda r: r.update(nx=2**64),
    "a medium whose load is a number": lambda r: r.update(load=5),
    "a medium with a million extra values": lambda r: r.update(junk=[0] * 1_000_000),
}


@pytest.mark.parametrize("case", list(FORGED))
def test_a_forged_media_record_is_checked(case: str, tmp_path: Path) -> None:
    """A ``media`` record outside the schema is skipped with a line, or (an unknown kind) kept as
    "other"; the other records are read as before."""
    recs = read_log(IMAGES)
    first = next(r for r in recs if r["type"] == "media")
    FORGED[case](first)
    f = load_session(write_log(tmp_path / "forged.log", recs))
    whole = load_session(IMAGES)
    if case == "a medium of kind video":
        assert f.media["kind"].astype(str).tolist() == ["other", "image"]
    elif case.startswith("a medium with"):
        assert f.report.skipped == [] and len(f.media) == 2
    else:
        assert [w.split(" (")[0] for _, w in f.report.skipped] == ["malformed media record"]
        assert f.media["id"].tolist() == [2]
    assert f.encodes["step"].tolist() == whole.encodes["step"].tolist()


def _encode_begin(recs: Records) -> dict[str, Any]:
    return next(r for r in recs if r["type"] == "step_begin" and r["kind"] == "encode")


@pytest.mark.parametrize(
    "case",
    ["65 slices", "a slice of text", "first as a number", "a target of three"],
)
def test_an_encode_beyond_its_writer_is_skipped(case: str, tmp_path: Path) -> None:
    """An encode's step_begin naming more than the 64 medium slices its writer names, or fields
    of other types: skipped as a malformed step_begin (its computes and end go with it)."""
    recs = copy.deepcopy(read_log(IMAGES))
    begin = _encode_begin(recs)
    if case == "65 slices":
        begin["media"] = [[1, 0]] * 65
    elif case == "a slice of text":
        begin["media"] = [[1, "0"]]
    elif case == "first as a number":
        begin["first"] = 1
    else:
        begin["target"] = [2, 0, 1]
    f = load_session(write_log(tmp_path / "forged.log", recs))
    assert [w.split(" (")[0] for _, w in f.report.skipped] == ["malformed step_begin record"]
    assert begin["step"] not in f.encodes["step"].tolist()
    assert len(f.encodes) == len(load_session(IMAGES).encodes) - 1


def test_the_live_view_counts_no_encode_as_a_decode() -> None:
    """``instr follow``'s state: prompt and generated tokens are the decode steps', the window
    holds decode steps only, and the encodes are counted apart."""
    from llamacpp_instr.converters.analysis.follow import LiveState

    recs = read_log(IMAGES)
    state = LiveState()
    views = [v for r in recs if (v := state.add(r)) is not None]
    begins = [r for r in recs if r["type"] == "step_begin"]
    kinds = [r["kind"] for r in begins]
    assert [v.kind for v in views] == kinds
    encodes = [r for r in recs if r["type"] == "step_end" and kinds[begins.index(
        next(b for b in begins if b["step"] == r["step"]))] == "encode"]  # fmt: skip
    assert state.encodes_done == len(encodes) == 2
    assert state.encode_ns == sum(r["dur"] for r in encodes)
    assert state.prompt_tokens == sum(r["n_tokens"] for r in begins if r["kind"] == "prompt")
    assert state.gen_tokens == sum(r["n_tokens"] for r in begins if r["kind"] == "gen")
    assert state.steps_done == len(begins) - 2
    assert "encode" not in {v.kind for v in state.window}


def test_the_metrics_keep_encodes_out_of_the_decode_steps() -> None:
    """``instr follow --prometheus``: the step histograms count the decode steps, the encodes
    have their own (``encode_duration_seconds``)."""
    from prometheus_client.exposition import generate_latest

    from llamacpp_instr.converters.formats.live_figures import RequestTracker
    from llamacpp_instr.converters.formats.prometheus import Metrics

    recs = read_log(IMAGES)
    metrics, tracker = Metrics(), RequestTracker()
    for r in recs:
        metrics.observe(tracker.add(r))
    text = generate_latest(metrics.registry).decode()

    def value(name: str) -> float:
        line = next(x for x in text.splitlines() if x.startswith(name + " "))
        return float(line.split()[1])

    begins = [r for r in recs if r["type"] == "step_begin"]
    ends = {r["step"]: r for r in recs if r["type"] == "step_end"}
    pre = "llamacpp_instr:"
    for kind in ("prompt", "gen"):
        n = sum(1 for b in begins if b["kind"] == kind)
        assert value(pre + f'step_duration_seconds_count{{kind="{kind}"}}') == n
    assert 'kind="other"' not in text
    encodes = [ends[b["step"]] for b in begins if b["kind"] == "encode"]
    assert value(pre + "encode_duration_seconds_count") == len(encodes) == 2
    assert value(pre + "encode_duration_seconds_sum") == pytest.approx(
        sum(e["dur"] for e in encodes) / 1e9
    )
    decoded = sum(b["n_tokens"] for b in begins if b["kind"] != "encode")
    assert value(pre + "iteration_tokens_total_sum") == decoded


_RECS = read_log(IMAGES)


@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")),
    deadline=None,
    derandomize="FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(edits=record_edits(_RECS))
def test_fuzz_the_same_tables_as_the_reference(
    edits: list[tuple[int, str, Any]], tmp_path: Path
) -> None:
    """The images log with wrong types or values in any record: the same tables (media and
    encodes among them) from the bulk reader and the reference, or the same error."""
    recs = with_edits(_RECS, edits)
    assert_same_outcome(write_log(tmp_path / "fuzz.log", recs))
