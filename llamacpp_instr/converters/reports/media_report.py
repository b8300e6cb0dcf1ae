"""``instr summary``'s images and sounds: each one's time (load, preprocessing, encodes,
the prefill of its tokens, the tokens it costs) and its encodes by op type and by part of the
encoder, its encoder's first medium apart from the others (``analysis.media_time``)."""

from __future__ import annotations

from typing import Any

from ..analysis.frames import SessionFrames
from ..analysis.media_time import MediumTime, encode_split, media_times
from .report import Chart, Column, Fact, Section, Series, Table, rows_of

NOTE = (
    "load: its decoding from its file or bytes; preprocessing: resizing, slicing into tiles, a "
    "sound's mel spectrogram, and tokenizing; encode: its encoder's whole encodes (the graph's "
    "build, the compute, the embeddings copied out), of which the ops of the input's embedding, "
    "of the encoder's blocks and of the projector; prefill: the language model's decode steps "
    "that carry its embeddings. The first medium is its encoder's first encode in the process "
    "(the backend's threads started, a GPU's pipelines made)."
)
WAY_NOTE = (
    "Each bar is one {one}'s parts laid end to end, each as long as it took (in the run, another "
    "{one}'s parts may have come between them); encode: the rest is its encodes' time outside "
    "their timed ops (the graph's build, the embeddings copied out)."
)
APART_NOTE = (
    " The first {one} is its encoder's first encode in the process, whose time holds the "
    "encoder's first-time costs (the backend's threads started, a GPU's pipelines made): it is "
    "drawn apart, above the others."
)


# the media whose rows the summary shows at most: each encoder's first, then the costliest
SHOWN = 256


def _noun(kinds: list[str]) -> tuple[str, str]:
    if kinds == ["image"]:
        return "image", "images"
    if kinds == ["audio"]:
        return "sound", "sounds"
    return "medium", "media"


MEDIA_COLUMNS = [
    Column("media", "medium", "int"),
    Column("kind", "kind"),
    Column("size", "size"),
    Column("tokens", "tokens", "int"),
    Column("load_ms", "load (ms)", "f2"),
    Column("preprocess_ms", "preprocessing (ms)", "f2"),
    Column("encodes", "encodes", "int"),
    Column("encode_ms", "encode (ms)", "f2"),
    Column("embedding_ms", "embedding (ms)", "f2"),
    Column("blocks_ms", "blocks (ms)", "f2"),
    Column("projector_ms", "projector (ms)", "f2"),
    Column("prefill_steps", "prefill steps", "int"),
    Column("prefill_ms", "prefill (ms)", "f2"),
    Column("total_ms", "total (ms)", "f2"),
    Column("first", "first"),
]
# the same, as two tables that a page holds with nothing cut: each medium's time part by part,
# and what it is with its encodes by part of the encoder
_TIME_KEYS = ("tokens", "load_ms", "preprocess_ms", "encode_ms", "prefill_ms", "total_ms", "first")
TIME_COLUMNS = [c for c in MEDIA_COLUMNS if c.key in ("media", *_TIME_KEYS)]
PARTS_COLUMNS = [c for c in MEDIA_COLUMNS if c.key not in _TIME_KEYS]

# the media the picture of each one's way draws at most: the firsts, then the others shown
CHARTED = 24


# a medium's way, part by part, as the picture stacks it
WAY_PARTS = (
    "load",
    "preprocessing",
    "encode: embedding",
    "encode: blocks",
    "encode: projector",
    "encode: the rest",
    "prefill",
)


def _way(m: MediumTime) -> list[float]:
    """``m``'s parts (ms), in the order of ``WAY_PARTS``."""
    ops = m.embedding_ns + m.blocks_ns + m.projector_ns
    ns = [m.load_ns or 0, m.preprocess_ns or 0, m.embedding_ns, m.blocks_ns, m.projector_ns]
    return [v / 1e6 for v in (*ns, max(m.encode_ns - ops, 0), m.prefill_ns)]


def _label(m: MediumTime) -> str:
    noun = {"audio": "sound", "?": "medium"}.get(m.kind, m.kind)
    return f"{noun} {m.id}" + (" (first)" if m.first else "")


def _way_chart(shown: list[MediumTime], one: str) -> Chart:
    """Each medium's way as stacked bars on one time axis: its load, preprocessing, encodes by
    part of the encoder, and the prefill of its tokens; its encoder's first medium drawn apart
    (its encode holds the encoder's first-time costs)."""
    drawn = ([m for m in shown if m.first] + [m for m in shown if not m.first])[:CHARTED]
    ways = [_way(m) for m in drawn]
    apart = sum(1 for m in drawn if m.first)
    note = WAY_NOTE + (APART_NOTE if 0 < apart < len(drawn) else "")
    return Chart(
        name="media_way",
        kind="stacked",
        title=f"Each {one}'s way: its load, preprocessing, encode by part and prefill",
        x_label="time (ms)",
        y_label=one,
        categories=[_label(m) for m in drawn],
        series=[Series(name, [w[k] for w in ways]) for k, name in enumerate(WAY_PARTS)],
        value_fmt="f2",
        apart=apart,
        note=note.format(one=one),
    )


def _split_table(f: SessionFrames, key: str, title: str) -> Table:
    df = encode_split(f, key)
    df = df.assign(
        first_ms=df["first_ns"] / 1e6,
        rest_mean_ms=[None if v is None else v / 1e6 for v in df["rest_mean_ns"]],
    )
    name = "op type" if key == "op" else "part"
    cols = [
        Column("encoder", "encoder"),
        Column(key, name),
        Column("first_ms", "first medium (ms)", "f3"),
        Column("rest_mean_ms", "each other medium, mean (ms)", "f3"),
        Column("rest_media", "other media", "int"),
    ]
    return Table(
        name=f"encode_by_{key}",
        title=title,
        columns=cols,
        rows=rows_of(df.to_dict(orient="records"), [c.key for c in cols]),
        whole=key == "layer",
    )


def media_section(f: SessionFrames, top: int | None) -> tuple[Section | None, dict[str, Any]]:
    """The section (None for a run without images or sounds) and its json data."""
    mt = media_times(f, SHOWN)
    if mt is None:
        return None, {}
    one, many = _noun(mt.kinds)
    rows = [m.row() for m in mt.shown]
    facts = [
        Fact(many, mt.n_media, "int"),
        Fact(f"tokens of the {many}", mt.tokens, "int"),
        Fact("encodes", mt.encodes, "int"),
    ]
    for m in mt.first:
        facts.append(Fact(f"the first {one} ({one} {m.id}): encode (ms)", m.encode_ns / 1e6, "f2"))
    if mt.rest_encode_ns is not None:
        facts.append(Fact(f"each other {one}: encode, mean (ms)", mt.rest_encode_ns / 1e6, "f2"))
    if mt.shared:
        facts.append(
            Fact("shared encodes", "an encode of several media's slices counts whole for each")
        )
    if len(rows) < mt.n_media:
        facts.append(
            Fact("shown", f"{len(rows)} of {mt.n_media} {many}: the first, then the costliest")
        )
    shown = [{**r, "first": "first" if r["first"] else ""} for r in rows]
    # csv's table (--by media): every column; the page and a terminal show it as two
    table = Table(
        name="media_time",
        title=f"Per {one}: its load, preprocessing, encodes and prefill",
        columns=MEDIA_COLUMNS,
        rows=rows_of(shown, [c.key for c in MEDIA_COLUMNS]),
        only=("csv",),
    )
    times = Table(
        name="media_times",
        title=f"Per {one}: its load, preprocessing, encodes and prefill",
        columns=TIME_COLUMNS,
        rows=rows_of(shown, [c.key for c in TIME_COLUMNS]),
        top=top,
    )
    encodes = Table(
        name="media_encodes",
        title=f"Per {one}: what it is, and its encodes by part of the encoder",
        columns=PARTS_COLUMNS,
        rows=rows_of(shown, [c.key for c in PARTS_COLUMNS]),
        note=NOTE,
        top=top,
    )
    by_op = _split_table(f, "op", f"The encodes by op type: the first {one}, then the others")
    by_layer = _split_table(
        f, "layer", f"The encodes by part of the encoder: the first {one}, then the others"
    )
    title = f"Each {one}'s time" if one != "medium" else "Each image's and sound's time"
    section = Section(
        title,
        facts=facts,
        charts=[_way_chart(mt.shown, one)],
        tables=[table, times, encodes, by_op, by_layer],
    )
    data = {
        "media": rows,
        "media_count": mt.n_media,
        "encode_by_op": by_op.rows,
        "encode_by_layer": by_layer.rows,
    }
    return section, data
