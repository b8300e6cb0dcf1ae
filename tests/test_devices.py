"""Runs on several devices (a GPU through Vulkan, RPC servers), as every converter shows them: the
trace's device, copies and network tracks and flows, ``load_session``'s device columns and tables,
and the summary's and compare's figures per device.

Expected values are computed here from the raw NDJSON of the fixtures (real logs: a tiny model on
lavapipe fully and partly offloaded, and on two patched RPC servers), with the json module and
plain arithmetic, not with the converters' own helpers.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import FIXTURES, Page, read_log, trace_slices, write_log

from llamacpp_instr.cli import main
from llamacpp_instr.converters import load_session
from llamacpp_instr.converters.analysis.frames import SessionFrames
from llamacpp_instr.converters.formats import convert as trace

VULKAN_FULL = FIXTURES / "tiny-llama-vulkan-full-detailed.log.gz"
VULKAN_PARTIAL = FIXTURES / "tiny-llama-vulkan-partial-detailed.log.gz"
RPC2 = FIXTURES / "tiny-llama-rpc2-detailed.log.gz"
# CUDA logs the GPU script (bench/gpu_check.sh) wrote on an H200: a 1B Q4_K_M with random weights
# (Llama-3.2-1B's shapes), every layer or half of them offloaded, and a small MoE whose first
# four layers' experts stay on the CPU (--n-cpu-moe 4)
CUDA_FULL = FIXTURES / "l1b-cuda-full-detailed.log.gz"
CUDA_PARTIAL = FIXTURES / "l1b-cuda-half-detailed.log.gz"
CUDA_MOE = FIXTURES / "moe-cuda-ncmoe4-detailed.log.gz"
DEVICE_LOGS = [VULKAN_FULL, VULKAN_PARTIAL, RPC2, CUDA_FULL, CUDA_PARTIAL, CUDA_MOE]
ids = [p.name.split("-detailed")[0] for p in DEVICE_LOGS]


# --- the raw log, read here --------------------------------------------------------------------


class Raw:
    """A fixture's records and what they say, by hand."""

    def __init__(self, path: Path) -> None:
        self.recs = read_log(path)
        devs = self.recs[0]["machine"]["devices"]
        self.name = {d["index"]: d["name"] for d in devs}
        self.backend = {d["index"]: d["backend"] for d in devs}
        self.label = {
            d["index"]: f"{d['name']} {d['description']}" if d["backend"] == "RPC" else d["name"]
            for d in devs
        }
        self.cpu = next(d["index"] for d in devs if d["backend"] == "CPU")
        self.computes = self.of("compute")
        kinds = {(b["ctx"], b["step"]): b["kind"] for b in self.of("step_begin")}
        self.kind = kinds
        self.ends = {(e["ctx"], e["step"]): e for e in self.of("step_end")}

    def of(self, t: str) -> list[dict[str, Any]]:
        return [r for r in self.recs if r["type"] == t]

    def op_device(self, c: dict[str, Any], node: int) -> int:
        for d, i0, i1, *_ in c.get("splits", []):
            if i0 <= node < i1:
                return int(d)
        return self.cpu

    def layer_device(self, row: list[int]) -> int:
        return row[4] if len(row) == 5 else self.cpu

    def step_transfers(self, ctx: int, step: int) -> list[tuple[int, list[Any]]]:
        """(t_start, row) of the step's commands."""
        return [
            (t["t_start"], r)
            for t in self.of("transfers")
            if t["phase"] == "step" and t["ctx"] == ctx and t["step"] == step
            for r in t["rows"]
        ]

    def window(self, key: tuple[int, int]) -> tuple[int, int]:
        """From the step's start to the last thing it waited for."""
        e = self.ends[key]
        end = e["t_start"] + e["dur"]
        for c in self.computes:
            if (c["ctx"], c["step"]) == key:
                end = max(end, c["t_start"] + c["dur"])
        for t0, r in self.step_transfers(*key):
            end = max(end, t0 + r[9])
        return e["t_start"], end

    def compute_intervals(self, c: dict[str, Any]) -> dict[int, list[tuple[int, int]]]:
        """Each device's own measure of its work in a compute."""
        t0 = c["t_start"]
        out: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for d, s, dur, _, _ in c.get("busy", []):
            out[d].append((t0 + s, t0 + s + dur))
        for row in c.get("remote", []):
            out[row[1]].append((t0 + row[4], t0 + row[5]))
        for d, _, _, _, launch, end in c.get("splits", []):
            if d == self.cpu:
                out[d].append((t0 + launch, t0 + end))
        return out


def covered(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    """ns of [lo, hi) covered by any interval: a sweep over the boundaries."""
    points = sorted({lo, hi, *(x for iv in intervals for x in iv if lo <= x <= hi)})
    return sum(
        b - a
        for a, b in zip(points, points[1:], strict=False)
        if any(s <= a and b <= e for s, e in intervals)
    )


def minus(inner: list[tuple[int, int]], outer: list[tuple[int, int]], lo: int, hi: int) -> int:
    """ns of [lo, hi) in some interval of ``inner`` and none of ``outer``."""
    points = sorted({lo, hi, *(x for iv in inner + outer for x in iv if lo <= x <= hi)})
    total = 0
    for a, b in zip(points, points[1:], strict=False):
        if any(s <= a and b <= e for s, e in inner) and not any(
            s <= a and b <= e for s, e in outer
        ):
            total += b - a
    return total


# --- the trace ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=DEVICE_LOGS, ids=ids)
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    log = request.param
    out = tmp_path_factory.mktemp("trace") / "t.pftrace"
    stats, report = trace.convert(log, out)
    assert report.skipped == [] and not report.unknown_types
    slices, tracks = trace_slices(out.read_bytes())
    return Raw(log), slices, tracks, stats


@pytest.mark.fast
def test_ops_and_layers_on_their_devices_tracks(converted: Any) -> None:
    raw, slices, _, _ = converted
    want_ops: Counter[str] = Counter()
    want_dur: Counter[str] = Counter()
    want_layers: dict[str, list[int]] = defaultdict(list)
    for c in raw.computes:
        for op in c.get("ops", []):
            dev = raw.label[raw.op_device(c, op[0])]
            want_ops[dev] += 1
            want_dur[dev] += op[2]
        for row in c["layers"]:
            want_layers[raw.label[raw.layer_device(row)]].append(row[2])
    ops = [s for s in slices if s["cats"] == ("op",)]
    assert Counter(s["track"] for s in ops) == want_ops
    got_dur: Counter[str] = Counter()
    for s in ops:
        got_dur[s["track"]] += s["dur"]
    assert got_dur == want_dur
    assert len(want_ops) >= 2  # several devices ran ops
    layers = [s for s in slices if s["cats"] == ("layer",)]
    got_layers: dict[str, list[int]] = defaultdict(list)
    for s in layers:
        got_layers[s["track"]].append(s["dur"])
    assert {k: sorted(v) for k, v in got_layers.items()} == {
        k: sorted(v) for k, v in want_layers.items()
    }
    # every op and layer inside its device's part of its compute (one per compute and device)
    parts = [s for s in slices if s["cats"] == ("device",)]
    for s in ops + layers:
        assert s["depth"] >= 1
        assert any(
            p["track"] == s["track"]
            and p["ts"] <= s["ts"]
            and s["ts"] + s["dur"] <= p["ts"] + p["dur"]
            for p in parts
        )


@pytest.mark.fast
def test_splits_copies_and_device_timing(converted: Any) -> None:
    raw, slices, _, _ = converted
    by_cat = defaultdict(list)
    for s in slices:
        by_cat[s["cats"]].append(s)
    splits = by_cat[("split",)]
    assert len(splits) == sum(len(c.get("splits", [])) for c in raw.computes)
    for s in splits:
        assert s["track"] == "decode steps" and s["depth"] == 2
    copies = by_cat[("copy",)]
    raw_copies = [(c, x) for c in raw.computes for x in c.get("copies", [])]
    assert len(copies) == len(raw_copies) > 0
    assert sum(s["args"]["bytes"] for s in copies) == sum(x[3] for _, x in raw_copies)
    assert Counter(s["name"] for s in copies) == Counter(
        f"{raw.name[x[4]]} → {raw.name[x[5]]}" for _, x in raw_copies
    )
    # (copies that overlap in time, as a MoE's expert uploads on the device's stream beside the
    # host's own copies, take a second track: a track's slices may not overlap)
    assert "copies" in {s["track"] for s in copies}
    assert all(s["track"] in ("copies", "copies (2)", "copies (3)") for s in copies)
    busy = by_cat[("busy",)]
    raw_busy = [(c["t_start"] + b[1], b[2]) for c in raw.computes for b in c.get("busy", [])]
    assert sorted((s["ts"], s["dur"]) for s in busy) == sorted(raw_busy)
    remote = by_cat[("remote",)]
    raw_remote = [
        (c["t_start"] + r[4], r[5] - r[4], r[6]) for c in raw.computes for r in c.get("remote", [])
    ]
    assert sorted((s["ts"], s["dur"], s["args"]["one_way_ns"]) for s in remote) == sorted(
        raw_remote
    )
    assert busy or remote
    # the gap: from the host's launch of each split to the device's first work for it
    for c in raw.computes:
        for k, (_, _, _, _, launch, _) in enumerate(c.get("splits", [])):
            firsts = [b[1] for b in c.get("busy", []) if b[3] == k]
            firsts += [r[4] for r in c.get("remote", []) if r[0] == k]
            if firsts:
                (s,) = [
                    x
                    for x in splits
                    if x["ts"] == c["t_start"] + c["splits"][k][3] and x["args"]["split"] == k
                ]
                assert s["args"]["device_start_ns"] == min(firsts) - launch


@pytest.mark.fast
def test_flows_from_each_split_to_its_device(converted: Any) -> None:
    raw, slices, _, _ = converted
    outs = [f for s in slices if s["cats"] == ("split",) for f in s["flows_out"]]
    ins = [f for s in slices if s["cats"] in (("busy",), ("remote",)) for f in s["flows_in"]]
    want = sum(
        len(
            {b[3] for b in c.get("busy", []) if b[3] >= 0}
            | {r[0] for r in c.get("remote", []) if r[0] >= 0}
        )
        for c in raw.computes
    )
    assert len(outs) == len(set(outs)) == want > 0
    assert sorted(outs) == sorted(ins)


@pytest.mark.fast
def test_network_tracks_carry_every_command(converted: Any) -> None:
    raw, slices, tracks, _ = converted
    rows = [(t["t_start"], r) for t in raw.of("transfers") for r in t["rows"]]
    net = [s for s in slices if s["cats"] == ("transfer",)]
    assert len(net) == len(rows)
    if not rows:
        assert "network" not in {t["name"] for t in tracks.values()}
        return
    parent = next(u for u, t in tracks.items() if t["name"] == "network")
    assert all(tracks[s["track_uuid"]]["parent"] == parent for s in net)
    want = Counter(
        (
            t0 + r[7],
            r[9] - r[7],
            r[1],
            round((r[4] + r[5]) * 1e3 / (r[9] - r[7]), 3) if r[9] > r[7] else 0.0,
        )
        for t0, r in rows
    )
    got = Counter((s["ts"], s["dur"], s["name"], s["args"]["mb_per_s"]) for s in net)
    assert got == want
    assert {s["args"]["phase"] for s in net} >= {"load", "step"}


@pytest.mark.fast
def test_chrome_json_shows_the_same(converted: Any, tmp_path: Path) -> None:
    raw, slices, _, _ = converted
    log = next(p for p in DEVICE_LOGS if read_log(p)[0]["sid"] == raw.recs[0]["sid"])
    out = tmp_path / "t.json"
    trace.convert(log, out, fmt="json")
    events = json.loads(out.read_text())
    names = {
        e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
    }
    got = Counter((names[e["tid"]], e["name"], e["ts"], e["dur"]) for e in events if e["ph"] == "X")
    want = Counter((s["track"], s["name"], s["ts"] / 1000, s["dur"] / 1000) for s in slices)
    assert got == want
    flows = Counter(e["ph"] for e in events if e.get("cat") == "device_flow")
    n = sum(len(s["flows_out"]) for s in slices if s["cats"] == ("split",))
    assert flows == Counter({"s": n, "f": n})


# --- the tables --------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=DEVICE_LOGS, ids=ids)
def frames(request: pytest.FixtureRequest) -> tuple[Raw, SessionFrames]:
    return Raw(request.param), load_session(request.param)


@pytest.mark.fast
def test_device_columns(frames: tuple[Raw, SessionFrames]) -> None:
    raw, f = frames
    want_ops = [raw.name[raw.op_device(c, op[0])] for c in raw.computes for op in c.get("ops", [])]
    assert f.ops["device"].astype(str).tolist() == want_ops
    want_layers = [raw.name[raw.layer_device(r)] for c in raw.computes for r in c["layers"]]
    assert f.layers["device"].astype(str).tolist() == want_layers
    assert list(f.ops["device"].cat.categories) == [raw.name[k] for k in sorted(raw.name)]
    assert f.devices["device"].tolist() == [raw.name[k] for k in sorted(raw.name)]
    assert "devices" in f.tables() and "device_steps" in f.tables()


@pytest.mark.fast
def test_device_tables(frames: tuple[Raw, SessionFrames]) -> None:
    raw, f = frames
    cs = raw.computes
    assert len(f.splits) == sum(len(c.get("splits", [])) for c in cs)
    assert f.splits["t_launch"].sum() == sum(
        c["t_start"] + s[4] for c in cs for s in c.get("splits", [])
    )
    assert len(f.copies) == sum(len(c.get("copies", [])) for c in cs)
    assert f.copies["bytes"].sum() == sum(x[3] for c in cs for x in c.get("copies", []))
    assert f.busy["dur_ns"].sum() == sum(b[2] for c in cs for b in c.get("busy", []))
    assert f.remote["dur_ns"].sum() == sum(r[5] - r[4] for c in cs for r in c.get("remote", []))
    rows = [r for t in raw.of("transfers") for r in t["rows"]]
    assert len(f.transfers) == len(rows)
    assert f.transfers["sent"].sum() == sum(r[4] for r in rows)
    # each step's devices: their own measure of their work, over the step's window
    for c in cs:
        key = (c["ctx"], c["step"])
        lo, hi = raw.window(key)
        tt = f.token_time[f.token_time["step"] == c["step"]]
        assert int(tt["token_ns"].iloc[0]) == hi - lo
        ds = f.device_steps[f.device_steps["step"] == c["step"]].set_index("device")
        for d, ivs in raw.compute_intervals(c).items():
            assert int(ds.loc[raw.name[d], "compute_ns"]) == sum(b - a for a, b in ivs)


@pytest.mark.fast
def test_cpu_only_logs_have_no_device_tables(tmp_path: Path) -> None:
    """A CPU-only log as today's build writes it (one CPU split, no copies, its machine's one
    device) reads as before: no device columns or tables, the same trace as without them."""
    recs = read_log(FIXTURES / "tiny-llama-detailed.log.gz")
    plain = write_log(tmp_path / "plain.log", recs)
    recs[0]["machine"] = {
        "cpu": "x", "n_cpus": 2,
        "devices": [{"index": 0, "name": "CPU", "backend": "CPU", "description": "x", "type": "cpu",
                     "memory_total": 1, "memory_free": 1}],
    }  # fmt: skip
    graphs = {g["graph"]: len(g["nodes"]) for g in recs if g["type"] == "graph"}
    for c in recs:
        if c["type"] == "compute":
            c.update(splits=[[0, 0, graphs[c["graph"]], 0, 10, c["dur"]]], copies=[], wait=5)
    split = write_log(tmp_path / "split.log", recs)
    f = load_session(split)
    assert "device" not in f.ops and "device" not in f.layers
    assert list(f.tables()) == list(SessionFrames.TABLES)
    a, b = tmp_path / "a.pftrace", tmp_path / "b.pftrace"
    trace.convert(plain, a)
    trace.convert(split, b)
    assert a.read_bytes() == b.read_bytes()
    r = CliRunner().invoke(main, ["summary", str(split), "--format", "json"])
    assert r.exit_code == 0 and "devices" not in json.loads(r.output)


# --- the summary and compare ------------------------------------------------------------------


def _summary(log: Path, fmt: str = "json") -> Any:
    r = CliRunner().invoke(main, ["summary", str(log), "--format", fmt])
    assert r.exit_code == 0, r.output
    return json.loads(r.output) if fmt == "json" else r.output


@pytest.mark.fast
@pytest.mark.parametrize("log", DEVICE_LOGS, ids=ids)
def test_summary_per_device_per_decode_token(log: Path) -> None:
    raw = Raw(log)
    data = _summary(log)
    gen = [c for c in raw.computes if raw.kind[(c["ctx"], c["step"])] == "gen"]
    keys = {(c["ctx"], c["step"]) for c in gen}
    tokens = sum(raw.ends[k]["n_tokens"] for k in keys)
    window = sum(raw.window(k)[1] - raw.window(k)[0] for k in keys)
    compute: Counter[int] = Counter()
    copy_bytes: Counter[int] = Counter()
    copy_ns: Counter[int] = Counter()
    for c in gen:
        for d, ivs in raw.compute_intervals(c).items():
            compute[d] += sum(b - a for a, b in ivs)
        for x in c.get("copies", []):
            for d in (x[4], x[5]):
                copy_bytes[d] += x[3]
                copy_ns[d] += x[7]
    by_name = {r["name"]: r for r in data["devices"]}
    assert set(by_name) == {raw.name[d] for d in compute}
    for d, name in raw.name.items():
        if name not in by_name:
            continue
        row = by_name[name]
        assert row["compute_ns"] == pytest.approx(compute[d] / tokens)
        assert row["share"] == pytest.approx(compute[d] / window)
        if raw.backend[d] == "RPC":  # the commands to its server, on the link
            mine = [(t0, r) for k in keys for t0, r in raw.step_transfers(*k) if r[0] == d]
            own = [iv for c in gen for iv in raw.compute_intervals(c).get(d, [])]
            nbytes = sum(r[4] + r[5] for _, r in mine)
            ns = sum(minus([(t0 + r[7], t0 + r[9])], own, t0 + r[7], t0 + r[9]) for t0, r in mine)
        else:
            nbytes, ns = copy_bytes[d], copy_ns[d]
        assert row["transfer_bytes"] == pytest.approx(nbytes / tokens)
        assert row["transfer_ns"] == pytest.approx(ns / tokens)
        if ns:
            assert row["bandwidth"] == pytest.approx(nbytes * 1e9 / ns)


@pytest.mark.fast
@pytest.mark.parametrize("log", DEVICE_LOGS, ids=ids)
def test_where_a_decode_token_goes(log: Path) -> None:
    """The token's window: devices computing, then data moving while none computes, then the
    host; and the bottleneck line names the largest."""
    raw = Raw(log)
    data = _summary(log)
    parts = data["device_time"]["decode"]["parts"]
    gen = [k for k, kind in raw.kind.items() if kind == "gen"]
    tokens = sum(raw.ends[k]["n_tokens"] for k in gen)
    total = Counter[str]()
    for k in gen:
        lo, hi = raw.window(k)
        work = [
            iv
            for c in raw.computes
            if (c["ctx"], c["step"]) == k
            for ivs in raw.compute_intervals(c).values()
            for iv in ivs
        ]
        moving = [(t0 + r[7], t0 + r[9]) for t0, r in raw.step_transfers(*k)]
        moving += [
            (c["t_start"] + x[6], c["t_start"] + x[6] + x[7])
            for c in raw.computes if (c["ctx"], c["step"]) == k for x in c.get("copies", [])
        ]  # fmt: skip
        total["compute"] += covered(work, lo, hi)
        total["transfer"] += minus(moving, work, lo, hi)
        total["token"] += hi - lo
    assert parts["compute_ns"] == pytest.approx(total["compute"] / tokens)
    assert parts["transfer_ns"] == pytest.approx(total["transfer"] / tokens)
    assert parts["host_ns"] == pytest.approx(
        (total["token"] - total["compute"] - total["transfer"]) / tokens
    )
    lines = data["device_time"]["bottleneck"]
    shares = {f"{r['name']} computes": r["share"] for r in data["devices"] if r["timed"]}
    kind = "network" if any(b == "RPC" for b in raw.backend.values()) else "copies"
    shares[kind] = total["transfer"] / total["token"]
    shares["host (no device computing, nothing moving)"] = parts["host_ns"] / parts["token_ns"]
    top = max(shares, key=lambda k: shares[k])
    assert lines[0] == f"{top}: {shares[top] * 100:.0f} % of a decode token"
    if log == RPC2:
        assert top == "network"  # the two hosts' round trips, the tiny model's compute small
    text = _summary(log, "text")
    assert "bottleneck:" in text and lines[0] in text and "Per decode token, per device" in text


@pytest.mark.fast
def test_load_phase_of_an_rpc_run() -> None:
    raw = Raw(RPC2)
    data = _summary(RPC2)
    rows = [
        (t["t_start"], r) for t in raw.of("transfers") if t["phase"] == "load" for r in t["rows"]
    ]
    assert rows
    for d in {r[0] for _, r in rows}:
        mine = sorted((t0 + r[7], t0 + r[9], r) for t0, r in rows if r[0] == d)
        assert all(a[1] <= b[0] for a, b in zip(mine, mine[1:], strict=False))  # one connection
        (row,) = [x["load"] for x in data["devices"] if x["name"] == raw.name[d]]
        nbytes = sum(r[4] + r[5] for _, _, r in mine)
        ns = sum(e - s for s, e, _ in mine)
        assert row["transfer_bytes"] == nbytes and row["transfer_ns"] == ns
        assert row["bandwidth"] == pytest.approx(nbytes * 1e9 / ns)
        assert row["data_bytes"] == sum(r[3] for _, _, r in mine)


@pytest.mark.fast
@pytest.mark.parametrize("fmt", ["text", "markdown", "csv", "html"])
def test_every_format_renders(fmt: str, tmp_path: Path) -> None:
    for log in DEVICE_LOGS:
        out = tmp_path / f"s.{fmt}"
        r = CliRunner().invoke(main, ["summary", str(log), "--format", fmt, "-o", str(out)])
        assert r.exit_code == 0, r.output
        if fmt != "csv":  # (csv: the op table, as for any log)
            assert "Per decode token" in out.read_text()


@pytest.mark.fast
def test_compare_partial_and_full_offload() -> None:
    r = CliRunner().invoke(
        main, ["compare", str(VULKAN_PARTIAL), str(VULKAN_FULL), "--format", "json"]
    )
    assert r.exit_code == 0, r.output
    rows = {x["device"]: x for x in json.loads(r.output)["devices"]["rows"]}
    a, b = _summary(VULKAN_PARTIAL), _summary(VULKAN_FULL)
    for side, data in (("a", a), ("b", b)):
        for d in data["devices"]:
            assert rows[d["name"]][f"compute_ms_{side}"] == pytest.approx(d["compute_ns"] / 1e6)
    assert rows["Vulkan0"]["layers_a"] == "2,3" and rows["Vulkan0"]["layers_b"] == "0-3"
    text = CliRunner().invoke(main, ["compare", str(VULKAN_PARTIAL), str(VULKAN_FULL)]).output
    assert "Vulkan0 layers:" in text and "2,3 → 0-3" in text


def test_html_pages(browser: Any, tmp_path: Path) -> None:
    raw = Raw(VULKAN_PARTIAL)
    out = tmp_path / "s.html"
    CliRunner().invoke(main, ["summary", str(VULKAN_PARTIAL), "--format", "html", "-o", str(out)])
    page = Page(browser, out)
    try:
        gen = sum(1 for k in raw.kind.values() if k == "gen")
        assert (
            page.marks("token_time_by_part") == 3 * gen == page.declared_marks("token_time_by_part")
        )
        assert page.marks("device_compute_per_token") == len(raw.name)
        assert page.rows("devices_decode") == len(raw.name)
        assert page.rows("token_parts_decode") == 4
    finally:
        page.close()
    out = tmp_path / "c.html"
    args = ["compare", str(VULKAN_PARTIAL), str(RPC2), "--format", "html", "-o", str(out)]
    assert CliRunner().invoke(main, args).exit_code == 0
    page = Page(browser, out)
    try:
        names = set(raw.name.values()) | set(Raw(RPC2).name.values())
        assert page.marks("device_compute_compare") == 2 * len(names)
    finally:
        page.close()


# --- damaged device fields --------------------------------------------------------------------


def _set(field: str, row: int, i: int, v: Any) -> Any:
    """An edit setting element ``i`` of row ``row`` of ``field`` to ``v``."""
    return field, lambda r: r[field][row].__setitem__(i, v)


def _do(field: str, fn: Any) -> Any:
    return field, fn


# what to break in which fixture: the first record holding the field (a step's for transfers)
DAMAGED = {
    "split device a string": (VULKAN_PARTIAL, _set("splits", 0, 0, "1")),
    "split device negative": (VULKAN_PARTIAL, _set("splits", 0, 0, -2)),
    "split ends before it starts": (VULKAN_PARTIAL, _set("splits", 1, 5, 0)),
    "split row short": (VULKAN_PARTIAL, _do("splits", lambda r: r["splits"][0].pop())),
    "splits not a list": (VULKAN_PARTIAL, _do("splits", lambda r: r.update(splits={"a": 1}))),
    "copy of no split": (VULKAN_PARTIAL, _set("copies", 0, 0, 9)),
    "copy bytes a float": (VULKAN_PARTIAL, _set("copies", 0, 3, 1.5)),
    "copy name a number": (VULKAN_PARTIAL, _set("copies", 0, 2, 7)),
    "busy split a string": (VULKAN_FULL, _set("busy", 0, 3, "x")),
    "busy negative dur": (VULKAN_FULL, _set("busy", 0, 2, -5)),
    "clock method a number": (VULKAN_FULL, _set("clocks", 0, 1, 3)),
    "layer device negative": (VULKAN_FULL, _set("layers", 0, 4, -1)),
    "layer device a string": (VULKAN_FULL, _set("layers", 0, 4, "0")),
    "layer row of six": (VULKAN_FULL, _do("layers", lambda r: r["layers"][0].append(0))),
    "remote row short": (RPC2, _do("remote", lambda r: r["remote"][0].pop())),
    "remote ends before it starts": (RPC2, _set("remote", 0, 5, 0)),
    "wait a string": (RPC2, _do("wait", lambda r: r.update(wait="0"))),
    "transfers phase unknown": (RPC2, _do("rows", lambda r: r.update(phase="later"))),
    "transfers times out of order": (RPC2, _set("rows", 0, 9, 0)),
    "transfers row short": (RPC2, _do("rows", lambda r: r["rows"][0].pop())),
    "transfers device a bool": (RPC2, _set("rows", 0, 0, True)),
    "transfers step missing": (RPC2, _do("rows", lambda r: r.pop("step"))),
}


def _break(recs: list[dict[str, Any]], field: str, fn: Any) -> int:
    """Breaks the first record holding ``field``; returns its line number."""
    for n, r in enumerate(recs, start=1):
        if field in r and (r["type"] != "transfers" or r["phase"] == "step"):
            fn(r)
            return n
    raise AssertionError(field)


@pytest.mark.fast
@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_device_field_skips_its_record(case: str, tmp_path: Path) -> None:
    src, (field, fn) = DAMAGED[case]
    recs = read_log(src)
    line = _break(recs, field, fn)
    log = write_log(tmp_path / "damaged.log", recs)
    for args in (
        ["summary", str(log)],
        ["summary", str(log), "--format", "json"],
        ["to-perfetto", str(log), "-o", str(tmp_path / "t.pftrace")],
        ["to-perfetto", str(log), "--format", "json", "-o", str(tmp_path / "t.json")],
        ["export", str(log), "-o", str(tmp_path / "tables")],
    ):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0 and r.exception is None, (args, r.output)
        assert f"skipped 1 of {len(recs)} lines: {line} (malformed " in r.output, r.output
    r = CliRunner().invoke(main, ["summary", str(log), "--strict"])
    assert r.exit_code == 2 and r.output.startswith("error: ") and r.output.count("\n") == 1
    assert f"line {line}: malformed" in r.output


def _minimal(recs: list[dict[str, Any]]) -> None:
    """As MINIMAL records it: layer spans, no ops (the devices' own timing kept)."""
    recs[0]["level"] = "minimal"
    for r in recs:
        r.pop("ops", None)
    recs[:] = [r for r in recs if r["type"] != "graph"]


def _stock_servers(recs: list[dict[str, Any]]) -> None:
    """As with stock RPC servers: nothing timed remotely, only the host's split times."""
    for d in recs[0]["machine"]["devices"]:
        if d["backend"] == "RPC":
            d["remote_timing"] = False
    for r in recs:
        if r["type"] == "compute":
            r.pop("remote", None)
            devs = {s[0]: (s[1], s[2]) for s in r["splits"] if s[0] != 0}
            r["ops"] = [o for o in r["ops"] if not any(a <= o[0] < b for a, b in devs.values())]
            r["layers"] = [x for x in r["layers"] if len(x) == 4]


@pytest.mark.fast
@pytest.mark.parametrize(
    "src,change", [(VULKAN_PARTIAL, _minimal), (RPC2, _minimal), (RPC2, _stock_servers)]
)
def test_what_a_log_may_lack(src: Path, change: Any, tmp_path: Path) -> None:
    """A MINIMAL log (no ops) and a run on stock RPC servers (no remote timing) show what they
    have: every output written, nothing skipped; a stock server's compute is not claimed."""
    recs = read_log(src)
    change(recs)
    log = write_log(tmp_path / "variant.log", recs)
    for fmt in ("text", "markdown", "json", "html"):
        r = CliRunner().invoke(main, ["summary", str(log), "--format", fmt])
        assert r.exit_code == 0 and "skipped" not in r.output, r.output
    for fmt in ("pftrace", "json"):
        _, report = trace.convert(log, tmp_path / f"t.{fmt}", fmt=fmt)
        assert report.skipped == []
    data = json.loads(CliRunner().invoke(main, ["summary", str(log), "--format", "json"]).output)
    for row in data["devices"]:
        if change is _stock_servers and row["backend"] == "RPC":
            assert not row["timed"] and row["compute_ns"] == 0 and row["transfer_bytes"] > 0
    if change is _stock_servers:
        lines = data["device_time"]["bottleneck"]
        assert lines[1] == (
            "RPC0, RPC1 timed nothing of their own (stock servers?): their compute is counted "
            "as network"
        )


@pytest.mark.fast
def test_a_cuda_decode_is_timed_on_the_gpu_at_each_level() -> None:
    """The real CUDA logs (an H200, CUDA graphs on): at DETAILED every decode compute's ops lie in
    its busy stretch on the GPU, one after another, and sum to less than it (a mark's own time is
    taken off each op's start); at MINIMAL each of the 16 offloaded layers has one span per decode
    compute inside its busy stretch, and no op is timed. Both on the GPU's clock (globaltimer)."""
    for path, detailed in ((CUDA_FULL, True), (FIXTURES / "l1b-cuda-full-minimal.log.gz", False)):
        raw = Raw(path)
        cuda = next(i for i, b in raw.backend.items() if b == "CUDA")
        decodes = [c for c in raw.computes if c["n_tokens"] == 1]
        assert decodes
        for c in decodes:
            assert [k[1] for k in c["clocks"]] == ["globaltimer"]
            (busy,) = [b for b in c["busy"] if b[0] == cuda]
            b0, b1 = busy[1], busy[1] + busy[2]
            if detailed:
                ops = sorted((o[1], o[1] + o[2]) for o in c["ops"])
                gpu = [(a, z) for a, z in ops if b0 <= a and z <= b1]
                assert len(gpu) == busy[4]  # every op the stretch ran, timed
                assert all(z1 <= a2 for (_, z1), (a2, _) in zip(gpu, gpu[1:], strict=False))
                assert 0 < sum(z - a for a, z in gpu) < busy[2]
            else:
                assert "ops" not in c
                spans = [lr for lr in c["layers"] if b0 <= lr[1] and lr[1] + lr[2] <= b1]
                assert sorted(lr[0] for lr in spans) == list(range(16))
