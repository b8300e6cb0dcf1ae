"""Where a token's time goes per device, as report pieces: the summary's ``Devices`` section and
compare's. Both read the tables of ``analysis.frames_devices`` (``device_steps``, ``token_time``), whose
figures ``device_time`` defines; a CPU-only log has none, and its reports have no such section.

Phases: ``decode`` (generation steps; the figures are per generated token: totals over the
steps divided by their tokens), ``prompt`` (totals over the prompt steps) and ``load`` (the
commands sent to RPC servers before the session: the model's upload).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..session import device_time as dt
from .report import Chart, Column, Fact, Section, Series, Table

PHASES = {"decode": "gen", "prompt": "prompt", "load": "load"}
_SUM = (
    "compute_ns op_ns n_ops outstanding_ns idle_ns gap_ns wait_ns copy_in_bytes "
    "copy_out_bytes copy_ns sent_bytes recv_bytes data_bytes net_ns n_cmds transfer_bytes "
    "transfer_ns"
).split()
_PARTS = ("token_ns", "compute_ns", "transfer_ns", "host_ns")
MAX_STEPS_CHARTED = 64


def has_devices(f: Any) -> bool:
    return not f.devices.empty


def _transfer_kind(f: Any) -> str:
    return "network" if (f.devices["backend"] == "RPC").any() else "copies"


def phase(f: Any, name: str, only: set[int] | None = None) -> dict[str, Any] | None:
    """One phase's figures: ``devices`` (a row per device), ``parts`` (its window split into
    compute, transfers and the host), ``tokens`` and ``steps``; per token for ``decode``, totals
    otherwise; over the steps in ``only`` when given. None when the log has no step of that
    phase."""
    kind = PHASES[name]
    tt = f.token_time[f.token_time["kind"] == kind]
    ds = f.device_steps[f.device_steps["kind"] == kind]
    if only is not None:
        tt, ds = tt[tt["step"].isin(only)], ds[ds["step"].isin(only)]
    if tt.empty:
        return None
    tokens = int(tt["n_tokens"].sum())
    div = tokens if name == "decode" and tokens else 1
    parts: dict[str, Any] = {k: float(tt[k].sum()) / div for k in _PARTS}
    parts["transfer_kind"] = _transfer_kind(f)
    token = float(tt["token_ns"].sum())
    meta = f.devices.set_index("device")
    owned = _owned_layers(f, set(tt["step"].dropna().astype(int)))
    rows = []
    for dev, g in ds.groupby("device", observed=True, sort=False):
        row: dict[str, Any] = {"name": str(dev)}
        m = meta.loc[dev] if dev in meta.index else None
        row["backend"] = str(m["backend"]) if m is not None else ""
        row["description"] = str(m["description"]) if m is not None else ""
        row.update({k: float(g[k].sum()) / div for k in _SUM})
        row["timed"] = bool(g["timed"].any())
        row["share"] = float(g["compute_ns"].sum()) / token if token else 0.0
        mine = owned[owned["device"] == dev]
        row["layers"] = sorted({int(x) for x in mine["layer"]})
        row["n_layers"] = len(row["layers"])
        row["layer_ns"] = float(mine["dur_ns"].sum()) / div  # the spans of the layers it ran
        row["bandwidth"] = dt.bandwidth(row["transfer_bytes"], row["transfer_ns"])
        rows.append(row)
    return {"tokens": tokens, "steps": len(tt), "parts": parts, "devices": rows}


def _owned_layers(f: Any, steps: set[int]) -> pd.DataFrame:
    """The layer spans of ``steps`` on the device that ran most of each layer's ops (a device
    running a layer's last op or two, the scheduler's boundary, does not run the layer)."""
    lay = f.layers[f.layers["step"].isin(steps)]
    if lay.empty or "device" not in lay:
        return pd.DataFrame(columns=["device", "layer", "dur_ns"])
    top = lay.sort_values("n_ops", ascending=False, kind="stable")
    owner = top.drop_duplicates(["step", "ubatch", "layer"])[["step", "ubatch", "layer", "device"]]
    return lay.merge(owner, on=["step", "ubatch", "layer", "device"])


def load_phase(f: Any) -> dict[str, Any] | None:
    """The load phase (RPC commands before the session), or None."""
    tt = f.token_time[f.token_time["kind"] == "load"]
    if tt.empty:
        return None
    ds = f.device_steps[f.device_steps["kind"] == "load"]
    rows = []
    for _, r in ds.iterrows():
        rows.append(
            {
                "name": str(r["device"]),
                "n_cmds": int(r["n_cmds"]),
                "data_bytes": int(r["data_bytes"]),
                "sent_bytes": int(r["sent_bytes"]),
                "recv_bytes": int(r["recv_bytes"]),
                "transfer_bytes": int(r["transfer_bytes"]),
                "transfer_ns": int(r["transfer_ns"]),
                "bandwidth": dt.bandwidth(int(r["transfer_bytes"]), int(r["transfer_ns"])),
            }
        )
    return {"span_ns": int(tt["token_ns"].sum()), "devices": rows}


def figures(f: Any) -> dict[str, Any]:
    """Every phase's figures and the bottleneck lines (the summary's JSON ``devices`` and
    ``device_time``)."""
    out: dict[str, Any] = {p: phase(f, p) for p in ("decode", "prompt")}
    out["load"] = load_phase(f)
    main = out["decode"] or out["prompt"]
    what = "a decode token" if out["decode"] else "the prompt"
    lines = dt.bottleneck(main["devices"], main["parts"], what) if main else []
    median = _median_step(f)
    typical = phase(f, "decode", {median}) if median is not None else None
    if typical is not None and out["decode"]["steps"] > 2:
        # the mean may be a few slow first tokens (a GPU compiling its shaders): the typical one
        first = dt.bottleneck(typical["devices"], typical["parts"], "it")
        if first and lines and first[0].split(":")[0] != lines[0].split(":")[0]:
            lines.append(f"the median decode token (step {median}): {first[0]}")
    out["bottleneck"] = lines
    return out


def _median_step(f: Any) -> int | None:
    """The generation step whose window is the median one (ties: the earliest)."""
    tt = f.token_time[f.token_time["kind"] == "gen"].sort_values(["token_ns", "step"])
    if tt.empty:
        return None
    return int(tt.iloc[(len(tt) - 1) // 2]["step"])


def devices_json(fig: dict[str, Any]) -> list[dict[str, Any]]:
    """``devices: [{name, compute_ns, transfer_bytes, transfer_ns, ...}]``: per decode token (or
    the prompt's totals when nothing was generated), each with its ``prompt`` and ``load``."""
    main = fig["decode"] or fig["prompt"]
    rows = [dict(r) for r in (main["devices"] if main else [])]
    for key in ("prompt", "load"):
        by_name = {r["name"]: r for r in (fig[key] or {}).get("devices", [])}
        for r in rows:
            r[key] = by_name.get(r["name"])
    return rows


_DEVICE_COLS = [
    Column("name", "device"),
    Column("layers_text", "layers"),
    Column("compute_ms", "compute (ms)", "f3"),
    Column("share", "share of time", "pct"),
    Column("n_ops", "ops", "f1"),
    Column("transfer_bytes", "moved", "bytes"),
    Column("transfer_ms", "transfer (ms)", "f3"),
    Column("mb_s", "MB/s", "f1"),
    Column("wait_ms", "client wait (ms)", "f3"),
    Column("idle_ms", "idle (ms)", "f3"),
    Column("gap_ms", "launch gap (ms)", "f3"),
]


def _layers_text(layers: list[int]) -> str:
    if not layers:
        return "–"
    if layers == list(range(layers[0], layers[-1] + 1)) and len(layers) > 2:
        return f"{layers[0]}-{layers[-1]}"
    return ",".join(map(str, layers))


def _device_rows(ph: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for r in ph["devices"]:
        timed = r["timed"]
        out.append(
            {
                "name": r["name"] + (f" {r['description']}" if r["backend"] == "RPC" else ""),
                "layers_text": _layers_text(r["layers"]),
                "compute_ms": r["compute_ns"] / 1e6 if timed else None,
                "share": r["share"] if timed else None,
                "n_ops": r["n_ops"],
                "transfer_bytes": r["transfer_bytes"],
                "transfer_ms": r["transfer_ns"] / 1e6,
                "mb_s": r["bandwidth"] / 1e6 if r["bandwidth"] is not None else None,
                "wait_ms": r["wait_ns"] / 1e6 if r["backend"] != "CPU" else None,
                "idle_ms": r["idle_ns"] / 1e6 if timed and r["backend"] != "CPU" else None,
                "gap_ms": r["gap_ns"] / 1e6 if timed and r["backend"] != "CPU" else None,
            }
        )
    return out


def _parts_rows(ph: dict[str, Any]) -> list[dict[str, Any]]:
    p = ph["parts"]
    token = p["token_ns"]
    names = [
        ("compute_ns", "a device computing"),
        ("transfer_ns", f"{p['transfer_kind']} (no device computing)"),
        ("host_ns", "host (neither)"),
        ("token_ns", "all"),
    ]
    return [
        {"part": label, "ms": p[k] / 1e6, "share": p[k] / token if token else None}
        for k, label in names
    ]


_PART_COLS = [
    Column("part", "part"),
    Column("ms", "time (ms)", "f3"),
    Column("share", "share", "pct"),
]
_LOAD_COLS = [
    Column("name", "device"),
    Column("n_cmds", "commands", "int"),
    Column("data_bytes", "tensor data", "bytes"),
    Column("sent_bytes", "sent", "bytes"),
    Column("recv_bytes", "received", "bytes"),
    Column("transfer_ms", "on the link (ms)", "f2"),
    Column("mb_s", "MB/s", "f1"),
]

SECTION_TEXT = (
    "Per device, from the log's own times: compute is the device's own measure (Vulkan: its "
    "command buffers by its timestamps; an RPC server: the graphs it computed, by its clock; the "
    "CPU backend: its splits); moved is what crossed to and from it (RPC: the commands' bytes; "
    "otherwise the scheduler's copies), transfer its time on the link or in the copy calls, "
    "client wait the time the host computed nothing while the device had work or data in flight, "
    "idle the time the device had work outstanding but did not compute (waiting on the host, its "
    "submission or the network), launch gap from handing a split over to the device starting it. "
    "Shares are of the step's time from its start to the last thing it waited for."
)


def _chart(f: Any) -> Chart | None:
    tt = f.token_time[f.token_time["kind"] == "gen"].sort_values("step")
    if len(tt) < 1:
        return None
    if len(tt) > MAX_STEPS_CHARTED:  # evenly spaced steps
        tt = tt.iloc[
            [round(k * (len(tt) - 1) / (MAX_STEPS_CHARTED - 1)) for k in range(MAX_STEPS_CHARTED)]
        ]
    kind = _transfer_kind(f)
    return Chart(
        name="token_time_by_part",
        kind="stacked",
        title="Each generated token's time: devices computing, data moving, the host",
        x_label="time (ms)",
        y_label="step",
        categories=[f"step {int(s)}" for s in tt["step"]],
        series=[
            Series("a device computing", (tt["compute_ns"] / 1e6).tolist()),
            Series(f"{kind} (no device computing)", (tt["transfer_ns"] / 1e6).tolist()),
            Series("host (neither)", (tt["host_ns"] / 1e6).tolist()),
        ],
        value_fmt="f2",
    )


def _share_chart(ph: dict[str, Any]) -> Chart:
    rows = [r for r in ph["devices"] if r["timed"]]
    return Chart(
        name="device_compute_per_token",
        kind="bars",
        title="Each device's compute per generated token (its own measure)",
        x_label="time (ms)",
        y_label="device",
        categories=[r["name"] for r in rows],
        series=[Series("compute", [r["compute_ns"] / 1e6 for r in rows])],
        value_fmt="f3",
    )


def section(f: Any) -> tuple[Section | None, dict[str, Any]]:
    """The summary's ``Devices`` section and its JSON (``devices``, ``device_time``), or
    ``(None, {})`` for a log on one device."""
    if not has_devices(f):
        return None, {}
    fig = figures(f)
    tables = []
    charts = []
    for key, title in (("decode", "Per decode token"), ("prompt", "Prompt (all its steps)")):
        ph = fig[key]
        if ph is None:
            continue
        what = f"mean of {ph['tokens']} tokens" if key == "decode" else f"{ph['tokens']} tokens"
        tables.append(
            Table(f"devices_{key}", f"{title}, per device ({what})", _DEVICE_COLS, _device_rows(ph))
        )
        tables.append(
            Table(
                f"token_parts_{key}", f"{title}: where the time goes", _PART_COLS, _parts_rows(ph)
            )
        )
        if key == "decode":
            charts.append(_share_chart(ph))
    load = fig["load"]
    if load is not None:
        rows = [
            {**r, "transfer_ms": r["transfer_ns"] / 1e6,
             "mb_s": r["bandwidth"] / 1e6 if r["bandwidth"] is not None else None}
            for r in load["devices"]
        ]  # fmt: skip
        title = f"Load: the commands before the session ({load['span_ns'] / 1e6:.1f} ms)"
        tables.append(Table("devices_load", title, _LOAD_COLS, rows))
    chart = _chart(f)
    if chart is not None:
        charts.insert(0, chart)
    facts = [Fact("bottleneck", line) for line in fig["bottleneck"]]
    sec = Section("Devices", facts=facts, charts=charts, tables=tables, text=SECTION_TEXT)
    data = {"devices": devices_json(fig), "device_time": fig}
    return sec, data


# --- compare ---------------------------------------------------------------------------------


def compare(a: Any, b: Any) -> dict[str, Any] | None:
    """Per device, what moved from A to B (per decode token), or None when neither log is on
    several devices. A log on one device counts as its CPU computing its ops."""
    if not (has_devices(a) or has_devices(b)):
        return None
    fa, fb = _decode_or_cpu(a), _decode_or_cpu(b)
    names = list(
        dict.fromkeys([r["name"] for r in fa["devices"]] + [r["name"] for r in fb["devices"]])
    )
    ra = {r["name"]: r for r in fa["devices"]}
    rb = {r["name"]: r for r in fb["devices"]}
    rows = []
    for n in names:
        x, y = ra.get(n), rb.get(n)
        row: dict[str, Any] = {"device": n}
        for side, r in (("a", x), ("b", y)):
            row[f"layers_{side}"] = _layers_text(r["layers"]) if r else "–"
            row[f"compute_ms_{side}"] = r["compute_ns"] / 1e6 if r and r["timed"] else None
            row[f"share_{side}"] = r["share"] if r and r["timed"] else None
            row[f"transfer_bytes_{side}"] = r["transfer_bytes"] if r else None
            row[f"transfer_ms_{side}"] = r["transfer_ns"] / 1e6 if r else None
        ca, cb = row["compute_ms_a"], row["compute_ms_b"]
        row["ratio"] = cb / ca if ca and cb is not None else None
        rows.append(row)
    parts = {
        side: {k: v / 1e6 if k != "transfer_kind" else v for k, v in ph["parts"].items()}
        for side, ph in (("a", fa), ("b", fb))
    }
    return {"rows": rows, "parts_ms": parts}


def _decode_or_cpu(f: Any) -> dict[str, Any]:
    if has_devices(f):
        ph = phase(f, "decode") or phase(f, "prompt")
        if ph is not None:
            return ph
    gen = f.steps[f.steps["kind"] == "gen"]
    steps = gen if not gen.empty else f.steps
    tokens = max(1, int(steps["n_tokens"].sum()))
    ops = f.ops[f.ops["step"].isin(steps["step"])]
    token = float(steps["dur_ns"].sum()) / tokens
    compute = float(ops["dur_ns"].sum()) / tokens
    layers = sorted({int(x) for x in ops["layer"].dropna()})
    cpu = {
        "name": "CPU", "backend": "CPU", "description": "", "timed": not ops.empty,
        "compute_ns": compute, "share": compute / token if token else 0.0, "layers": layers,
        "n_layers": len(layers), "transfer_bytes": 0, "transfer_ns": 0,
    }  # fmt: skip
    parts: dict[str, Any] = {"token_ns": token, "compute_ns": compute, "transfer_ns": 0.0}
    parts.update(host_ns=token - compute, transfer_kind="copies")
    return {"devices": [cpu], "parts": parts}


def compare_section(d: dict[str, Any]) -> Section:
    cols = [
        Column("device", "device"),
        Column("layers_a", "layers A"),
        Column("layers_b", "layers B"),
        Column("compute_ms_a", "compute A (ms)", "f3"),
        Column("compute_ms_b", "compute B (ms)", "f3"),
        Column("ratio", "B/A", "ratio"),
        Column("share_a", "share A", "pct"),
        Column("share_b", "share B", "pct"),
        Column("transfer_bytes_a", "moved A", "bytes"),
        Column("transfer_bytes_b", "moved B", "bytes"),
    ]
    pa, pb = d["parts_ms"]["a"], d["parts_ms"]["b"]
    facts = [
        Fact("decode token A (ms)", pa["token_ns"], "f3"),
        Fact("decode token B (ms)", pb["token_ns"], "f3"),
        Fact(f"{pa['transfer_kind']} with no device computing A (ms)", pa["transfer_ns"], "f3"),
        Fact(f"{pb['transfer_kind']} with no device computing B (ms)", pb["transfer_ns"], "f3"),
    ]
    for r in d["rows"]:
        if r["layers_a"] != r["layers_b"]:
            facts.append(Fact(f"{r['device']} layers", f"{r['layers_a']} → {r['layers_b']}"))
    chart = Chart(
        name="device_compute_compare",
        kind="bars",
        title="Each device's compute per generated token, A and B",
        x_label="time (ms)",
        y_label="device",
        categories=[r["device"] for r in d["rows"]],
        series=[
            Series("A", [r["compute_ms_a"] or 0.0 for r in d["rows"]]),
            Series("B", [r["compute_ms_b"] or 0.0 for r in d["rows"]]),
        ],
        value_fmt="f3",
    )
    return Section(
        "Devices",
        text="Per generated token (the prompt's totals when a run generated nothing); a run on "
        "one device counts as its CPU computing its timed ops.",
        facts=facts,
        charts=[chart],
        tables=[Table("devices", "Per device, per decode token", cols, d["rows"])],
    )
