"""Inputs for mtmd in the tests' child scripts: a medium the projector takes, and the chunks of
"look: <medium>". A script begins with ``ON_PATH`` to import this module."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np

# a script's first line: this folder's parent (tests/) on its path
ON_PATH = f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})\n"


def medium(mtmd: Any, ctx: Any, width: int, height: int) -> Any:
    """A bitmap of what ctx's projector takes: a flat grey ``width`` x ``height`` RGB image where
    it sees, else 1 s of a tone at 16 kHz (mtmd copies either)."""
    if mtmd.mtmd_support_vision(ctx):
        n = width * height * 3
        return mtmd.mtmd_bitmap_init(width, height, (ctypes.c_ubyte * n)(*[128] * n))
    wave = np.sin(np.arange(16000) * 0.05).astype(np.float32)
    pcm = wave.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    return mtmd.mtmd_bitmap_init_from_audio(len(wave), pcm)


def look_chunks(mtmd: Any, ctx: Any, bmp: Any) -> Any:
    """The chunks of "look: <marker>" with ``bmp`` as its medium, special tokens parsed and added
    (mtmd_tokenize's status asserted 0); the caller frees them."""
    text = mtmd.mtmd_input_text()
    text.text = b"look: " + mtmd.mtmd_default_marker()
    text.text_len = len(text.text)
    text.add_special = text.parse_special = True
    chunks = mtmd.mtmd_input_chunks_init()
    bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bmp)
    rc = mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1)
    assert rc == 0, rc
    return chunks
