"""The 64-bit hash a log names a medium by (an image's or a sound's bytes): the ``hash`` of a
``media`` record and of a request body's ``instr_media`` marker, as the native side computes it
(``hash_bytes`` in patches/overlay/src/llama-instr-media.cpp), written as 16 lowercase hex digits.
"""

from __future__ import annotations

import sys
from array import array

_MASK = (1 << 64) - 1
_SEED = 0x9E3779B97F4A7C15
_WORD_MUL = 0xBF58476D1CE4E5B9
_TAIL_MUL = 0x94D049BB133111EB


def media_hash(data: bytes) -> str:
    """The hash of ``data``: each whole 8-byte little-endian word mixed in turn, then the last
    0 to 7 bytes as one zero-padded word; all arithmetic modulo 2**64."""
    n = len(data)
    whole = n - n % 8
    words = array("Q", data[:whole])
    if sys.byteorder == "big":
        words.byteswap()
    h = _SEED ^ n
    for w in words:
        h = ((h ^ w) * _WORD_MUL) & _MASK
        h ^= h >> 31
    tail = int.from_bytes(data[whole:], "little")
    h = ((h ^ tail) * _TAIL_MUL) & _MASK
    return (h ^ (h >> 29)).to_bytes(8, "big").hex()
