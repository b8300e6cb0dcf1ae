"""What a medium file is, from its own bytes, and what a projector file is, from its header:
the checks a run's images, sounds and projector get before anything loads (no library: a
decoder handed a forged header allocates what the header claims, so the header is read here
first)."""

from __future__ import annotations

import struct
from pathlib import Path

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import models

# An image's largest side mtmd is given: past it a decoder's buffer alone is gigabytes, and every
# projector resizes to a few thousand pixels at most.
IMAGE_MAX_SIDE = 16384

IMAGE, AUDIO = "image", "audio"


def check_projector(path: Path) -> None:
    """``path`` is a GGUF projector (llama.cpp's ``clip`` architecture), not a model."""
    models.check_gguf(path)
    arch = models.gguf_architecture(path)
    if arch != "clip":
        raise UserError(
            f"{path} is not a projector (mmproj) file: its architecture is {arch or 'unknown'}, "
            "a projector's is clip"
        )


def check_file(kind: str, path: Path) -> None:
    """A medium file that exists, is of its kind by its first bytes, and, an image, of a size
    mtmd can hold."""
    if not path.is_file():
        raise UserError(f"--{kind} {path}: no such file")
    try:
        with path.open("rb") as f:
            head = f.read(64 * 1024)
    except OSError as exc:
        raise UserError(f"--{kind} {path}: {exc.strerror}") from None
    if kind == AUDIO:
        if not is_audio(head):
            raise UserError(f"--audio {path}: not a sound mtmd reads (WAV, MP3 or FLAC)")
        return
    if is_audio(head):
        raise UserError(f"--image {path}: a sound, not an image (give it with --audio)")
    size = image_size(head)
    if size is None:
        raise UserError(
            f"--image {path}: not an image mtmd reads (JPEG, PNG, GIF, BMP or PNM) or a header "
            "cut short"
        )
    width, height = size
    if width < 1 or height < 1 or max(width, height) > IMAGE_MAX_SIDE:
        raise UserError(
            f"--image {path}: {width}x{height} pixels; a side must be 1 to {IMAGE_MAX_SIDE}"
        )
    if not image_complete(head, path):
        raise UserError(f"--image {path}: cut short (it lacks its end marker)")


def is_audio(head: bytes) -> bool:
    """WAV, FLAC or MP3 (an ID3 tag, or an MPEG audio frame's sync), as mtmd's helper sniffs."""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return True
    if head[:4] == b"fLaC" or head[:3] == b"ID3":
        return True
    return len(head) >= 2 and head[0] == 0xFF and (head[1] & 0xE0) == 0xE0


def image_size(head: bytes) -> tuple[int, int] | None:
    """An image's width and height from its header (JPEG, PNG, GIF, BMP, PNM), or None for
    anything else or a header cut short."""
    if head[:8] == b"\x89PNG\r\n\x1a\n" and len(head) >= 24 and head[12:16] == b"IHDR":
        return struct.unpack(">II", head[16:24])  # type: ignore[return-value]
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        return struct.unpack("<HH", head[6:10])  # type: ignore[return-value]
    if head[:2] == b"BM" and len(head) >= 26:
        width, height = struct.unpack("<ii", head[18:26])
        return width, abs(height)
    if head[:2] == b"\xff\xd8":
        return _jpeg_size(head)
    if head[:2] in (b"P3", b"P5", b"P6"):
        return _pnm_size(head)
    return None


def image_complete(head: bytes, path: Path) -> bool:
    """Does the file end as its format ends (a JPEG's EOI marker, a PNG's IEND chunk)? A decoder
    given one cut short may fill the rest with grey and say nothing."""
    if head[:2] != b"\xff\xd8" and head[:8] != b"\x89PNG\r\n\x1a\n":
        return True
    size = path.stat().st_size
    with path.open("rb") as f:
        f.seek(max(0, size - 4096))
        tail = f.read().rstrip(b"\x00")  # (padding after the end marker)
    if head[:2] == b"\xff\xd8":
        return b"\xff\xd9" in tail[-64:]
    return b"IEND" in tail[-64:]


def _jpeg_size(head: bytes) -> tuple[int, int] | None:
    """The size in a JPEG's first start-of-frame marker (SOF0..SOF15 but DHT, JPG, DAC)."""
    i = 2
    while i + 4 <= len(head):
        if head[i] != 0xFF:
            return None
        marker = head[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            i += 2
            continue
        (length,) = struct.unpack(">H", head[i + 2 : i + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 9 > len(head):
                return None
            height, width = struct.unpack(">HH", head[i + 5 : i + 9])
            return width, height
        if length < 2:
            return None
        i += 2 + length
    return None


def _pnm_size(head: bytes) -> tuple[int, int] | None:
    words: list[int] = []
    for line in head[2:].split(b"\n"):
        for word in line.split(b"#")[0].split():
            if not word.isdigit():
                return None
            words.append(int(word))
            if len(words) == 2:
                return words[0], words[1]
    return None
