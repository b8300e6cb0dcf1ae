"""Hostile logs at the reading door (issue 55, sections 2 and 3): crafted from the committed
fixtures (and the hand-made server log of ``test_metrics``), each ends in one line and exit 2 or
a clean run, within memory proportional to the log; ``instr requests`` does work proportional to
its steps; the Prometheus labels taken from a log stay bounded; and a seeded fuzzer of every
reading command (``log_fuzz``)."""

from __future__ import annotations

import copy
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.log_fuzz import FIXTURES, SEEDS, check_result, fixture, fuzz, run_metrics, server_log
from test_otlp import Receiver

from llamacpp_instr.cli import main
from llamacpp_instr.converters.session import request_causes

Records = list[dict[str, Any]]


def _write(path: Path, recs: Records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _with_request(**fields: Any) -> Records:
    """The server log with its last request's fields changed."""
    recs = server_log()
    req = [r for r in recs if r["type"] == "request"][-1]
    req.update(fields)
    return recs


def _edited(name: str, rtype: str, fn: Any) -> Records:
    recs = fixture(name)
    for r in recs:
        if r["type"] == rtype:
            fn(r)
    return recs


def _with_part(**fields: Any) -> Records:
    """The detailed fixture with a llama-bench ``part`` record before its end."""
    recs = fixture(DETAILED)
    end = recs.pop()
    part = {"type": "part", "ts": end["ts"], "sid": end["sid"], "label": "pp5", "t_start": 1}
    return [*recs, part | {"dur": 1000, "samples_ns": [1000]} | fields, end]


def _start(fn: Any) -> Records:
    recs = server_log()
    fn(recs[0])
    return recs


def _shape_2000(g: dict[str, Any]) -> None:
    for n in g.get("nodes", [])[:40]:
        n["shape"] = [7] * 2000


DETAILED = "tiny-llama-detailed.log.gz"
MOE = "smollm2-moe4-verbose.log.gz"  # 4 layers of 8 experts, 2 used; a prompt of 5 tokens
SPEC = "seeds/smollm2-spec-minimal.log.gz"  # llama-server speculating: a target and its draft
IMAGES = "tiny-llama-gemma3-images-detailed.log.gz"  # llama-mtmd-cli: two images, two encodes


def _encode_begin(fn: Any) -> Records:
    """The images log with its first encode's step_begin changed by ``fn``."""
    recs = fixture(IMAGES)
    fn(next(r for r in recs if r["type"] == "step_begin" and r["kind"] == "encode"))
    return recs


HOSTILE: dict[str, Any] = {
    "request status 2**63": lambda: _with_request(status=2**63),
    "request slot 2**63": lambda: _with_request(slot=2**63),
    "request t_arrive 2**64": lambda: _with_request(t_arrive=2**64),
    "request t_arrive soon": lambda: _with_request(t_arrive="soon"),
    "request prompt_tokens -3": lambda: _with_request(prompt_tokens=-3),
    "context n_ctx -1": lambda: _start(lambda s: s["context"].update(n_ctx=-1)),
    "compute t_start 2**64": lambda: _edited(
        DETAILED, "compute", lambda r: r.update(t_start=2**64)
    ),
    "step dur 2**64": lambda: _edited(DETAILED, "step_end", lambda r: r.update(dur=2**64)),
    "layer span 2**63": lambda: _edited(
        DETAILED, "compute", lambda r: r["layers"][0].__setitem__(2, 2**63 - 1)
    ),
    "a 2000-dimension shape": lambda: _edited(DETAILED, "graph", _shape_2000),
    "weights without buffer": lambda: _edited(
        DETAILED,
        "session_start",
        lambda r: r.update(weights=[{k: v for k, v in r["weights"][0].items() if k != "buffer"}]),
    ),
    "experts rows 20,000": lambda: _edited(
        MOE, "experts", lambda r: r.update(rows=[[i % 4, i % 8, 1, 0.5] for i in range(20_000)])
    ),
    "experts n_expert 65536": lambda: _edited(MOE, "experts", lambda r: r.update(n_expert=65536)),
    "experts ids x 100": lambda: _edited(
        MOE, "experts", lambda r: [b.__setitem__(2, b[2] * 100) for b in r["tokens"]]
    ),
    "spec drafted 2**63": lambda: _edited(SPEC, "spec", lambda r: r.update(drafted=2**63)),
    "spec draft_steps 10**5 long": lambda: _edited(
        SPEC, "spec", lambda r: r.update(draft_steps=[0] * 10**5)
    ),
    "part samples_ns of text": lambda: _with_part(samples_ns=["x"]),
    "part label 2**64": lambda: _with_part(label=2**64),
    "spec context n_layer 2**64": lambda: _edited(
        SPEC, "context", lambda r: r["model"].update(n_layer=2**64)
    ),
    "media nx 2**64": lambda: _edited(IMAGES, "media", lambda r: r.update(nx=2**64)),
    "media id 0": lambda: _edited(IMAGES, "media", lambda r: r.update(id=0)),
    "media preprocess of text": lambda: _edited(
        IMAGES, "media", lambda r: r.update(preprocess=["a", "b"])
    ),
    "encoder context n_layer 2**64": lambda: _edited(
        IMAGES, "context", lambda r: r["model"].update(n_layer=2**64)
    ),
    "encoder modality 2**64": lambda: _edited(
        IMAGES, "context", lambda r: r["encoder"].update(modality=2**64)
    ),
    "encode of 10**5 slices": lambda: _encode_begin(lambda r: r.update(media=[[1, 0]] * 10**5)),
    "encode target 2**64": lambda: _encode_begin(lambda r: r.update(target=[2**64, 0])),
    "decode step media 2**63": lambda: _edited(
        IMAGES, "step_begin", lambda r: r.update(media=[2**63, 0]) if "media" in r else None
    ),
}


def _args(cmd: str, log: Path, out: Path) -> list[str]:
    return {
        "to-perfetto": [cmd, str(log), "-o", str(out / "t.pftrace")],
        "export": [cmd, str(log), "--format", "csv", "-o", str(out / "export")],
        "workloads": ["export", str(log), "--workloads", "-o", str(out / "w.jsonl")],
    }.get(cmd, [cmd, str(log), "--format", "json"])


@pytest.mark.fast
@pytest.mark.parametrize("case", list(HOSTILE))
@pytest.mark.parametrize(
    "cmd", ["summary", "to-perfetto", "export", "requests", "workloads", "experts"]
)
def test_a_hostile_value_is_one_line_or_a_clean_run(case: str, cmd: str, tmp_path: Path) -> None:
    log = _write(tmp_path / "hostile.log", HOSTILE[case]())
    args = _args(cmd, log, tmp_path)
    assert check_result(args, CliRunner().invoke(main, args)) is None


@pytest.mark.fast
@pytest.mark.parametrize("case", list(HOSTILE))
def test_metrics_keep_serving_past_a_hostile_value(case: str, tmp_path: Path) -> None:
    """``instr follow --prometheus``' loop (the ``exec --metrics`` sidecar's) reads on, and a scrape works."""
    log = _write(tmp_path / "hostile.log", HOSTILE[case]())
    assert run_metrics(log) is None


@pytest.mark.fast
@pytest.mark.parametrize("case", [k for k in HOSTILE if k.startswith(("request", "context"))])
def test_to_otlp_sends_past_a_hostile_request(case: str, tmp_path: Path) -> None:
    log = _write(tmp_path / "hostile.log", HOSTILE[case]())
    receiver = Receiver()
    try:
        r = CliRunner().invoke(main, ["export", str(log), "--otlp", receiver.url])
        assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
        assert r.exit_code == 0, r.output
        # the other five requests are sent whole; the hostile one is skipped or sent clamped
        assert len(receiver.requests()) >= 5
    finally:
        receiver.close()


# --- amplification --------------------------------------------------------------------------


def _amplified(n: int) -> Records:
    """The detailed fixture with ``n`` graph records of about 150 bytes each, every one naming
    its first table with a one-entry ``subst`` (the old reader built a whole table for each)."""
    recs = fixture(DETAILED)
    g = next(r for r in recs if r["type"] == "graph" and "nodes" in r)
    at = recs.index(g) + 1
    head = {k: g[k] for k in ("type", "ts", "sid", "ctx", "n_tokens")}
    forged = [
        head | {"graph": 100 + k, "same_as": g["graph"], "subst": [[1, 26, 27 + k]]}
        for k in range(n)
    ]
    return recs[:at] + forged + recs[at:]


def _peak_rss_mb(
    args: list[str], limit_bytes: int, forked_reader: bool = False
) -> tuple[int, float, str]:
    """Run ``instr ARGS`` in a child under an address-space limit: its exit status, its peak
    resident memory (MB; with ``forked_reader``, a big log's reading process counts too: the
    child's rusage takes the most of the processes it waited for) and its stderr."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "LLAMACPP_INSTR_NO_PREFETCH": "1"}
    if forked_reader:
        del env["LLAMACPP_INSTR_NO_PREFETCH"]
    p = subprocess.Popen(
        [sys.executable, "-m", "llamacpp_instr.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=limit,  # noqa: PLW1509 - a limit only, no threads here
        env=env,
    )
    assert p.stderr is not None
    err = p.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, usage.ru_maxrss / 1024, err


@pytest.mark.fast
@pytest.mark.parametrize("cmd", ["summary", "requests"])
def test_named_tables_cost_what_the_log_holds(cmd: str, tmp_path: Path) -> None:
    """20,000 records naming one table with a one-entry subst (3 MB of log): the command ends
    within 300 MB of what the fixture alone takes (the old reader's 65,536 tables of ~20 KB
    each: gigabytes, past the limit)."""
    small = _write(tmp_path / "small.log", fixture(DETAILED))
    big = _write(tmp_path / "big.log", _amplified(20_000))
    assert big.stat().st_size < 4_000_000
    limit = 3 << 30
    rc0, base_mb, err0 = _peak_rss_mb([cmd, str(small)], limit)
    rc, peak_mb, err = _peak_rss_mb([cmd, str(big)], limit)
    assert "Traceback" not in err0 + err
    assert rc in (0, 2) and rc == rc0, err
    if rc == 2:
        assert err.strip().splitlines()[-1].startswith("error: ")
    assert peak_mb < base_mb + 300, (base_mb, peak_mb)


@pytest.mark.fast
def test_tables_are_kept_within_the_writers_bounds() -> None:
    """A subst may name only one of the 16 tables written whole its context named last, and no
    more than 4,096 tables are kept per context (``table_memory``'s bounds)."""
    from llamacpp_instr.converters.reading.decode.fields import MALFORMED
    from llamacpp_instr.converters.reading.decode.graphs import (
        BASES_PER_CTX,
        TABLES_PER_CTX,
        Tables,
        graph_record,
    )

    g = next(r for r in fixture(DETAILED) if r["type"] == "graph" and "nodes" in r)
    tables = Tables()
    for k in range(BASES_PER_CTX + 1):
        graph_record(copy.deepcopy(g) | {"graph": k}, tables)
    named = {k: v for k, v in g.items() if k != "nodes"}
    with pytest.raises(MALFORMED):  # graph 0: the least recently named base, now forgotten
        graph_record(named | {"graph": 99, "same_as": 0, "subst": [[1, 26, 27]]}, tables)
    got = graph_record(named | {"graph": 98, "same_as": 1, "subst": [[1, 26, 27]]}, tables)
    assert got.nodes[0].shape == [256, 27]
    refused = 0
    for k in range(TABLES_PER_CTX + 10):
        try:
            graph_record(named | {"graph": 1000 + k, "same_as": 1, "subst": [[1, 26, 28]]}, tables)
        except MALFORMED:
            refused += 1  # graph 1 forgotten once 4,096 tables came after it (the writer wrote
            # it again then)
    assert len(tables) == TABLES_PER_CTX and 0 < refused <= 30
    # the named tables' nodes are not made until read
    assert sum(1 for v in tables.values() if "nodes" in v.__dict__) <= BASES_PER_CTX + 1


# --- instr requests on overlapping windows ---------------------------------------------------


def _overlapping(n: int) -> tuple[Records, list[tuple[int, int, int, list[tuple[int, int]]]]]:
    """``n`` requests, each on its own slot, every window from 0 to the end of the last step:
    three steps each (a prompt, two tokens), one after another, the second gap long."""
    MS = 1_000_000
    rows, reqs, t = [], [], MS
    for i in range(n):
        for k, dur in enumerate((MS, MS, 5 * MS)):
            rows.append((t, dur, 4 if k == 0 else 1, [(i, 4 if k == 0 else 1)]))
            t += dur
    for i in range(n):
        reqs.append(
            {"type": "request", "id": f"r{i}", "slot": i, "t_arrive": 0, "wait": 0}
            | {"ttft": MS, "model": t, "dur": t, "prompt_tokens": 4, "gen_tokens": 2}
        )
    return reqs, rows


def _work(n: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """Rows the step index hands out for ``n`` overlapping requests."""
    counted = [0]
    index = request_causes._StepIndex
    for name in ("began", "ended"):
        if hasattr(index, name):
            original = getattr(index, name)

            def counting(self: Any, *a: Any, _f: Any = original, **kw: Any) -> Any:
                got = _f(self, *a, **kw)
                counted[0] += len(got)
                return got

            monkeypatch.setattr(index, name, counting)
    reqs, rows = _overlapping(n)
    stories = request_causes.stories(reqs, rows)
    assert len(stories) == n
    monkeypatch.undo()
    return counted[0]


@pytest.mark.fast
def test_overlapping_request_windows_cost_what_the_steps_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """4,000 requests whose windows all overlap: the rows read grow with the steps (3 n), not
    with n times the steps (the old reading took every step of the window for each request)."""
    small, large = _work(250, monkeypatch), _work(4000, monkeypatch)
    assert large <= 16 * small * 1.1 + 100, (small, large)
    assert large <= 3 * 4000 * 4


@pytest.mark.fast
def test_overlapping_windows_keep_each_requests_own_story(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request of the overlapping case has its own steps: its third token late (the 5 ms
    step), with nothing else in its batch."""
    reqs, rows = _overlapping(40)
    for s in request_causes.stories(reqs, rows):
        assert [t.token for t in s.late_tokens] == [3]
        assert s.late_tokens[0].shared == []


# --- labels ---------------------------------------------------------------------------------


@pytest.mark.fast
def test_prometheus_labels_stay_bounded() -> None:
    """3,000 distinct outcomes and step kinds make no more series than the writer's values and
    ``other``."""
    from prometheus_client.exposition import generate_latest

    from llamacpp_instr.converters.formats.live_figures import RequestTracker
    from llamacpp_instr.converters.formats.prometheus import Metrics

    metrics, tracker = Metrics(), RequestTracker()
    recs = server_log()
    metrics.observe(tracker.add(recs[0]))
    req = [r for r in recs if r["type"] == "request"][0]
    begin = [r for r in recs if r["type"] == "step_begin"][0]
    end = [r for r in recs if r["type"] == "step_end"][0]
    for k in range(3000):
        metrics.observe(tracker.add(begin | {"kind": f"kind{k}"}))
        metrics.observe(tracker.add(end))
        metrics.observe(tracker.add(req | {"outcome": f"outcome{k}", "id": f"x{k}"}))
    text = generate_latest(metrics.registry).decode()
    outcomes = {line.split('outcome="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("llamacpp_instr:requests_total{")}  # fmt: skip
    kinds = {line.split('kind="')[1].split('"')[0] for line in text.splitlines()
             if line.startswith("llamacpp_instr:step_duration_seconds_count{")}  # fmt: skip
    assert outcomes == {"ok", "error", "cancelled", "other"}
    assert kinds <= {"prompt", "gen", "other"} and "other" in kinds


# --- the fuzzer -----------------------------------------------------------------------------


@pytest.mark.fast
def test_every_reading_command_survives_the_fuzzer(tmp_path: Path) -> None:
    """A seeded, bounded run (CI: about a minute on two slow cores): every reading command on
    each mutated log (each seed log once: the MoE's and the speculating server's among them)
    ends in exit 0, or 2 with an error line; never a traceback."""
    receiver = Receiver()
    try:
        found = fuzz(seed=55, cases=len(SEEDS), work=tmp_path, otlp_url=receiver.url)
    finally:
        receiver.close()
    assert found == []


# --- a mixture of experts' routing ------------------------------------------------------------


def _first_experts(recs: Records) -> dict[str, Any]:
    return next(r for r in recs if r["type"] == "experts")


def _moe_edited(fn: Any) -> tuple[Records, dict[str, Any]]:
    """The MoE fixture with its first ``experts`` record (the prompt's: every layer's router ranked
    5 rows but the last layer's, 1) changed by ``fn(recs, rec)``, and the record forged (that one,
    or the one ``fn`` returns)."""
    recs = fixture(MOE)
    rec = _first_experts(recs)
    forged = fn(recs, rec)
    return recs, forged if isinstance(forged, dict) else rec


def _forged_rows(recs: Records, rec: dict[str, Any]) -> None:
    rec["rows"] = [[i % 4, i % 8, 1, 0.5] for i in range(200_000)]


def _second(recs: Records, rec: dict[str, Any]) -> dict[str, Any]:
    again = copy.deepcopy(rec)
    recs.insert(recs.index(rec) + 1, again)
    return again


def _row_of(layer: int, **fields: Any) -> Any:
    def edit(recs: Records, rec: dict[str, Any]) -> None:
        row = next(r for r in rec["rows"] if r[0] == layer)
        for k, v in fields.items():
            row["layer expert tokens weight".split().index(k)] = v

    return edit


def _more_ids(recs: Records, rec: dict[str, Any]) -> None:
    blk = rec["tokens"][0]
    blk[2], blk[3] = blk[2] * 2, blk[3] * 2


def _wide_graph(recs: Records, rec: dict[str, Any]) -> None:
    """Its graph's routers say 65,536 experts each (4 x 65,536 cells), and so does the record."""
    for g in recs:
        if g["type"] == "graph" and g["graph"] == rec["graph"]:
            for n in g["nodes"]:
                if n["op"] == "ARGSORT":
                    n["shape"] = [65536] + n["shape"][1:]
    rec["n_expert"] = 65536


ROUTING_FORGED: dict[str, Any] = {
    "200,000 rows": _forged_rows,
    "a second record of its compute": _second,
    "a ubatch without a compute": lambda recs, r: r.update(ubatch=1),
    "n_expert of another model": lambda recs, r: r.update(n_expert=16),
    "n_layer below its routers": lambda recs, r: r.update(n_layer=3),
    "a layer without a router": lambda recs, r: (
        r.update(n_layer=8),
        r["rows"].append([6, 0, 1, 0.5]),
    ),
    "a layer's expert twice": lambda recs, r: r["rows"].append(list(r["rows"][0])),
    "an expert beyond the router's": _row_of(0, expert=8),
    "more tokens than the router ranked": _row_of(3, tokens=2),
    "a weight that is not a number": _row_of(1, weight="0.5"),
    "more ids than the router ranked": _more_ids,
    "routers of 65,536 experts": _wide_graph,
}


def _routing_read(recs: Records, tmp_path: Path) -> tuple[Any, list[str]]:
    """The experts frame of the log ``recs``, and why records were skipped."""
    from llamacpp_instr.converters import load_session

    f = load_session(_write(tmp_path / "moe.log", recs))
    return f.experts, [why for _, why in f.report.skipped]


def _raw_rows(recs: Records) -> list[tuple[int, int, int, int]]:
    return sorted(
        (r["step"], la, e, t) for r in recs if r["type"] == "experts" for la, e, t, _ in r["rows"]
    )


@pytest.mark.fast
def test_the_moe_fixtures_routing_is_read_whole(tmp_path: Path) -> None:
    """Every row of the untouched fixture, as the records hold them, and nothing skipped."""
    recs = fixture(MOE)
    ex, skipped = _routing_read(recs, tmp_path)
    assert skipped == []
    got = sorted(ex[["step", "layer", "expert", "tokens"]].itertuples(index=False, name=None))
    assert got == _raw_rows(recs) and len(got) == 19 + 8 + 8


@pytest.mark.fast
@pytest.mark.parametrize("case", list(ROUTING_FORGED))
def test_an_experts_record_is_bounded_by_its_computes_graph(case: str, tmp_path: Path) -> None:
    """A record beyond what its compute's graph allows (its routers' layers, experts and ranked
    rows; one record per compute) is skipped as malformed, the other steps' routing kept."""
    recs, forged = _moe_edited(ROUTING_FORGED[case])
    ex, skipped = _routing_read(recs, tmp_path)
    assert [w for w in skipped if w.startswith("malformed experts record")] == skipped
    assert len(skipped) == 1, skipped
    kept = [r for r in recs if r["type"] == "experts" and r is not forged]
    assert sorted(ex[["step", "layer", "expert", "tokens"]].itertuples(index=False, name=None)) == (
        _raw_rows(kept)
    )


def _forged_moe_log(path: Path) -> Path:
    """The MoE fixture and, after its first experts record, 16 more of 200,000 rows each, every
    row's layer and expert in the model's range (about 50 MB)."""
    recs = fixture(MOE)
    first = _first_experts(recs)
    rows = json.dumps([[i % 4, i % 8, 1, 0.5] for i in range(200_000)])
    head = json.dumps({k: v for k, v in first.items() if k != "rows"})[:-1]
    forged = f'{head}, "rows": {rows}}}\n' * 16
    at = recs.index(first) + 1
    with path.open("w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in recs[:at]))
        f.write(forged)
        f.write("".join(json.dumps(r) + "\n" for r in recs[at:]))
    return path


@pytest.mark.parametrize("forked", [False, True], ids=["read here", "forked reader"])
@pytest.mark.parametrize("cmd", ["experts", "summary"])
def test_forged_experts_records_cost_at_most_four_times_the_log(
    cmd: str, forked: bool, tmp_path: Path
) -> None:
    """16 records of 200,000 rows (the reader once held them all: 805 MB for a 54 MB log): the
    command ends within four times the log's size beyond what the fixture alone takes, the
    records skipped; read in the command's process, and as a big log is by default, by a forked
    reader (whose batches once held every one of the records at once, on both sides)."""
    small = _write(tmp_path / "small.log", fixture(MOE))
    big = _forged_moe_log(tmp_path / "big.log")
    size_mb = big.stat().st_size / 2**20
    assert size_mb > 45
    limit = 3 << 30
    rc0, base_mb, err0 = _peak_rss_mb([cmd, str(small)], limit)
    rc, peak_mb, err = _peak_rss_mb([cmd, str(big)], limit, forked_reader=forked)
    assert "Traceback" not in err0 + err
    assert rc0 == 0 and rc == 0, err
    assert peak_mb - base_mb < 4 * size_mb, (base_mb, peak_mb, size_mb)
    assert "skipped 16 of" in err and "malformed experts record" in err


# --- the other per-record tables ----------------------------------------------------------------


@pytest.mark.fast
def test_a_request_record_keeps_only_the_schemas_fields(tmp_path: Path) -> None:
    """A request with a field the schema does not name (a million items), and a ``cache`` object
    with one too: the session holds neither; the record's own fields are read as written."""
    from llamacpp_instr.converters import load_session

    recs = _with_request(junk=[0] * 1_000_000)
    req = [r for r in recs if r["type"] == "request"][-1]
    req["cache"] = {"prompt": 9, "reused": 4, "held": 6, "common": 5, "junk": [1] * 1000}
    f = load_session(_write(tmp_path / "r.log", recs))
    got = f.info.requests[-1]
    assert "junk" not in got and "junk" not in got["cache"]
    assert got["cache"] == {"prompt": 9, "reused": 4, "held": 6, "common": 5}
    assert {k: got[k] for k in ("id", "t_arrive", "prompt_tokens")} == {
        k: req[k] for k in ("id", "t_arrive", "prompt_tokens")
    }


def _rpc_transfers(fn: Any) -> Records:
    """The RPC fixture with its first step's ``transfers`` record changed by ``fn``."""
    recs = fixture("tiny-llama-rpc2-detailed.log.gz")
    fn(next(r for r in recs if r["type"] == "transfers" and r["phase"] == "step"))
    return recs


@pytest.mark.fast
@pytest.mark.parametrize(
    "case",
    ["4097 rows", "a tensor name of 64 characters", "a command of 33 characters"],
)
def test_a_transfers_record_is_bounded_by_its_writer(case: str, tmp_path: Path) -> None:
    """At most 4096 rows a record, a tensor's name of at most 63 bytes (GGML_MAX_NAME), a
    command's of at most 32: beyond, the record is skipped; the other records are read."""
    from llamacpp_instr.converters import load_session

    def edit(r: dict[str, Any]) -> None:
        if case == "4097 rows":
            r["rows"] = (r["rows"] * 4097)[:4097]
        elif case.startswith("a tensor"):
            r["rows"][0][2] = "t" * 64
        else:
            r["rows"][0][1] = "c" * 33

    recs = _rpc_transfers(edit)
    f = load_session(_write(tmp_path / "rpc.log", recs))
    assert [why.split(" (")[0] for _, why in f.report.skipped] == ["malformed transfers record"]
    whole = load_session(_write(tmp_path / "whole.log", fixture("tiny-llama-rpc2-detailed.log.gz")))
    assert len(f.transfers) == len(whole.transfers) - 18  # that record's rows only


@pytest.mark.fast
def test_the_parts_table_reads_the_steps_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """3,000 ``part`` records: the steps' labels are compared with the parts' once, not once a
    part (the table took its steps times its parts); a part's figures are its steps'."""
    import pandas as pd

    from llamacpp_instr.converters import load_session
    from llamacpp_instr.converters.reports.request_share import part_rows

    f = load_session(FIXTURES / DETAILED)
    f.steps["request"] = pd.Categorical(["pp"] + ["tg"] * (len(f.steps) - 1))
    f.info.parts = [{"label": "pp", "t_start": 0, "dur": 1}, {"label": "tg", "t_start": 0}]
    f.info.parts += [{"label": f"x{k}", "t_start": 0, "dur": 1} for k in range(3000)]
    compared = [0]
    eq = pd.Series.__eq__

    def counting(self: Any, other: Any) -> Any:
        compared[0] += 1
        return eq(self, other)

    monkeypatch.setattr(pd.Series, "__eq__", counting)
    rows = part_rows(f)
    monkeypatch.undo()
    assert compared[0] < 10, compared[0]
    assert len(rows) == 3002 and rows[2]["steps"] == 0
    pp = f.steps.iloc[:1]
    assert (rows[0]["steps"], rows[0]["tokens"]) == (1, int(pp["n_tokens"].sum()))
    assert rows[1]["steps"] == len(f.steps) - 1
    assert rows[0]["decode_ms"] == int(pp["dur_ns"].sum()) / 1e6


# --- images and sounds ------------------------------------------------------------------------


def _forged_media_log(path: Path, n_media: int, n_encodes: int) -> Path:
    """The images log with ``n_media`` more ``media`` records (each its own id and hash) and
    ``n_encodes`` more encodes (a step_begin naming 64 of their slices and a step_end each),
    after its first medium."""
    recs = fixture(IMAGES)
    medium = next(r for r in recs if r["type"] == "media")
    begin = next(r for r in recs if r["type"] == "step_begin" and r["kind"] == "encode")
    end = next(r for r in recs if r["type"] == "step_end" and r["step"] == begin["step"])
    at = recs.index(medium) + 1
    with path.open("w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in recs[:at]))
        for k in range(n_media):
            f.write(json.dumps(medium | {"id": 10**6 + k, "hash": f"{k:016x}"}) + "\n")
        for k in range(n_encodes):
            pairs = [[10**6 + (64 * k + j) % max(1, n_media), j] for j in range(64)]
            step = 10**6 + k
            f.write(json.dumps(begin | {"step": step, "media": pairs, "first": False}) + "\n")
            f.write(json.dumps(end | {"step": step}) + "\n")
        f.write("".join(json.dumps(r) + "\n" for r in recs[at:]))
    return path


@pytest.mark.parametrize("cmd", ["summary", "to-perfetto", "export"])
def test_forged_media_and_encodes_cost_at_most_twice_the_log(cmd: str, tmp_path: Path) -> None:
    """60,000 media records and 10,000 encodes of 64 slices each (about 30 MB): the command ends
    within twice the log's size beyond what the fixture alone takes; the media are read, and
    the summary shows the first and the costliest of them, not all."""
    small = _write(tmp_path / "small.log", fixture(IMAGES))
    big = _forged_media_log(tmp_path / "big.log", 60_000, 10_000)
    size_mb = big.stat().st_size / 2**20
    assert size_mb > 25
    limit = 3 << 30
    rc0, base_mb, err0 = _peak_rss_mb(_args(cmd, small, tmp_path), limit)
    rc, peak_mb, err = _peak_rss_mb(_args(cmd, big, tmp_path), limit)
    assert "Traceback" not in err0 + err
    assert rc0 == 0 and rc == 0, err
    assert peak_mb - base_mb < 2 * size_mb, (base_mb, peak_mb, size_mb)
