"""Attention at a depth no log ran (``instr predict --ctx-depth``) priced by the logs' cost per KV
cell: where the probe cannot measure it (``kv_probe``: logs of another machine, an RPC server's
ops, ``--no-probe``), an extrapolation the bench checks; with the probe, the price of an
attention op at the logs' most cells, to which the probe adds what the op takes more deeper.

A compute reads ``n_kv`` cells of the KV cache: its last position rounded up to ``KV_PAD`` (the
pin's ``get_n_kv``). Without flash attention the KQ and KQV matmuls and the softmax between them
work on every one of them, masked or not, so their work grows with ``n_kv`` and their class's
line (``op_costs``: a fixed cost and a cost per unit of work at the roofs) prices them there,
per cell. Flash attention's CPU kernel skips the cells a query row's mask hides (``-INFINITY``):
its work is the cells each row sees, ``pos0 + i`` for the ``i``-th row of a ubatch starting at
``pos0`` (``visible_cells``), and a log of a short prompt ran it on a few dozen of its 256. Its
time is fitted per device and cache type as ``fixed + per_row * rows + per_cell * cells`` over
the logs' computes, every layer's together (``RowLine``): generation's steps, one row at a position one further each
time, give the cost per cell; a prompt's ubatch, its rows (what they pay whatever they see).
The pin's CPU kernel takes one of three paths by the shape (``cpu_path``), each with its own
costs: one query row over at least 512 cells has the threads split the cells; fewer than 64
rows go a row at a time; more, in tiles of 64 rows by 64 cells. On the CPU a line is fitted per
path where the logs ran it at two sizes or more; a path they did not run is priced by the other
path that goes a row at a time (a generation at a depth beyond 256 cells from logs of short
prompts runs the split path no log ran: the depth grid checks that extrapolation), else by the
line of all of them.

Beyond the most cells the logs' computes read (``CostModel.max_kv``), an attention op is priced
so, up to ``KV_EXTRAPOLATION`` times them (what bench/predict.py's depth grid checks), and the
prediction says it is an extrapolation; past it, and past the model's ``n_ctx_train``, not
predicted.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

# llama.cpp's KV cache is read in multiples of this many cells (the pin's get_n_kv)
KV_PAD = 256
# how many times the KV cells the logs' computes read an attention op is priced at: the bench's
# depth grid predicts depths of 512 to 4096 from logs of short prompts (256 cells: 17x)
KV_EXTRAPOLATION = 17.0
FLASH = "FLASH_ATTN_EXT"
# the pin's ggml-cpu flash attention (ops.cpp, ggml_compute_forward_flash_attn_ext_f16): the
# rows of a tile (GGML_FA_TILE_Q), and the KV cells from which one row's are split among threads
FA_TILE_ROWS = 64
FA_SPLIT_CELLS = 512


def n_kv(end: int, n_ctx: int) -> int:
    """KV cells a ubatch ending at position ``end`` reads (the pin's get_n_kv)."""
    padded = -(-max(end, 1) // KV_PAD) * KV_PAD
    return min(n_ctx, max(KV_PAD, padded))


def visible_cells(pos0: int, n_tokens: int) -> int:
    """The cells a ubatch's query rows see, summed over its rows (causal, one sequence): row
    ``i`` (from 1) at position ``pos0 + i - 1`` sees ``pos0 + i``."""
    return n_tokens * pos0 + n_tokens * (n_tokens + 1) // 2


def compute_positions(frames: Any) -> dict[tuple[int, int], tuple[int, int]]:
    """Each compute of a log, by (step, ubatch): its first position and its tokens (the
    step's ``pos0`` and its ubatches' tokens in order)."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    if frames.ops.empty or "pos0" not in frames.steps:
        return out
    pos0 = frames.steps.set_index("step")["pos0"]
    cols = frames.ops[["step", "ubatch", "graph"]].drop_duplicates().sort_values(["step", "ubatch"])
    at: dict[int, int] = {}
    for step, ub, gid in cols.itertuples(index=False):
        g = frames.graphs.get(int(gid))
        if g is None or int(step) not in pos0.index or pd.isna(pos0[int(step)]):
            continue
        start = at.get(int(step), int(pos0[int(step)]))
        out[(int(step), int(ub))] = (start, int(g.n_tokens))
        at[int(step)] = start + int(g.n_tokens)
    return out


def cpu_path(rows: int, cells: float) -> str:
    """The path the pin's CPU flash attention takes for a compute of ``rows`` query rows seeing
    ``cells`` KV cells in all: ``split`` (one row, the cache read at least FA_SPLIT_CELLS cells:
    the threads split the cells), ``rows`` (fewer than FA_TILE_ROWS rows, one at a time) or
    ``tiled``. One row at position ``p`` sees ``p + 1`` cells and the cache is read in multiples of
    KV_PAD, so the split path is where it sees more than FA_SPLIT_CELLS - KV_PAD (a context of
    fewer than FA_SPLIT_CELLS cells never splits: not told apart here)."""
    if rows == 1:
        return "split" if cells > FA_SPLIT_CELLS - KV_PAD else "rows"
    return "rows" if rows < FA_TILE_ROWS else "tiled"


# the paths that run the same kernel a query row at a time, each the other's stand-in
ROW_PATHS = {"split": "rows", "rows": "split"}


@dataclass(frozen=True)
class RowLine:
    """Flash attention's time on one device: ``fixed + per_row * rows + per_cell * cells`` (ns),
    and the most cells a compute of the logs had it see; on the CPU, ``paths``: the line of each
    kernel path (``cpu_path``) the logs ran at two sizes or more, which prices its computes."""

    fixed: float
    per_row: float
    per_cell: float
    cells_hi: float
    paths: dict[str, RowLine] = field(default_factory=dict)

    def time(self, rows: int, cells: float) -> float:
        path = cpu_path(rows, cells)
        # a path no log ran at two sizes: the other of the two that go a row at a time (the
        # split one divides a row's cells among the threads), else the line of all of them
        own = self.paths.get(path) or self.paths.get(ROW_PATHS.get(path, ""))
        if own is not None:
            return own.time(rows, cells)
        return self.fixed + self.per_row * rows + self.per_cell * cells


def fit_rows(rows: np.ndarray, cells: np.ndarray, dur: np.ndarray, fixed: float) -> RowLine | None:
    """The ``RowLine`` through the device's ``fixed`` cost per op, by least squares over the
    distinct (rows, cells) the logs ran (each its ops' median time, weighted by their count),
    neither cost below 0; None where fewer than two distinct sizes leave the two costs
    undetermined."""
    df = pd.DataFrame({"r": rows, "c": cells, "d": dur})
    g = df.groupby(["r", "c"])["d"].agg(["median", "size"]).reset_index()
    if len(g) < 2:
        return None
    x = g[["r", "c"]].to_numpy(np.float64)
    y = g["median"].to_numpy(np.float64) - fixed
    w = np.sqrt(g["size"].to_numpy(np.float64))
    coef = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)[0]
    if coef[0] < 0 or coef[1] < 0:  # one of the two at 0: the other alone
        k = 1 if coef[0] < 0 else 0
        col = x[:, k]
        one = float(np.sum(w * w * col * y) / max(np.sum(w * w * col * col), 1e-30))
        coef = np.array([0.0, max(one, 0.0)] if k == 1 else [max(one, 0.0), 0.0])
    return RowLine(fixed, float(coef[0]), float(coef[1]), float(g["c"].max()))


def flash_lines(obs: pd.DataFrame, fixed: dict[Any, float]) -> dict[tuple[Any, str], RowLine]:
    """Per (where, cache type), flash attention's ``RowLine`` from the observed ops (``op_fit``'s
    frame with each op's ``where``, ``rows`` and ``cells``); ``fixed``: each device's fixed cost
    per op."""
    fa = obs[(obs["label"] == FLASH) & obs["cells"].notna()]
    out: dict[tuple[Any, str], RowLine] = {}
    for (where, typ), rows in fa.groupby(["where", "type0"], sort=False):
        r = rows["rows"].to_numpy()
        c = rows["cells"].to_numpy()
        d = rows["dur"].to_numpy(np.float64)
        line = fit_rows(r, c, d, fixed.get(where, 0.0))
        if line is None:
            continue
        if getattr(where, "device", None) == "CPU":
            path = np.array([cpu_path(int(a), float(b)) for a, b in zip(r, c, strict=True)])
            paths = {}
            for name in np.unique(path):
                sel = path == name
                own = fit_rows(r[sel], c[sel], d[sel], fixed.get(where, 0.0))
                if own is not None:
                    paths[str(name)] = own
            line = replace(line, paths=paths)
        out[(where, str(typ))] = line
    return out
