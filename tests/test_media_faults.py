"""The media hooks under faults, through the C API as mtmd calls it (no model or projector: an
encoder is any address described to the session, a bitmap any address loaded):

- an encode whose start fails partway (each allocation of the encode's begin and end failed in
  turn, in the testing build) leaves its encoder free: the next encode of it is recorded, and the
  log reopens after it, as logrotate asks;
- a medium's `load` is its own bitmap's: the newest load noted at its address, in this session or
  with none open, never one of a bitmap freed since nor one noted in an earlier session.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.support import by_type, read_log, run_on_lib

pytestmark = pytest.mark.native

ENCODES = r"""
import ctypes, json, os, sys
from llamacpp_instr.native import bindings

log = sys.argv[1]
api = bindings.load()
lib = api.lib

class Desc(ctypes.Structure):
    _fields_ = [("projector", ctypes.c_char_p), ("modality", ctypes.c_int32),
                ("n_layer", ctypes.c_int32), ("n_embd", ctypes.c_int32),
                ("n_embd_out", ctypes.c_int32), ("image_size", ctypes.c_int32),
                ("patch_size", ctypes.c_int32)]

lib.llama_instr_encoder_describe.argtypes = [ctypes.c_void_p, ctypes.POINTER(Desc)]
lib.llama_instr_encode_begin.argtypes = [ctypes.c_void_p, ctypes.c_int32]
lib.llama_instr_encode_begin.restype = ctypes.c_int64
lib.llama_instr_encode_end.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32,
                                       ctypes.c_int32, ctypes.c_int32]
lib.llama_instr_encode_end.restype = None
lib.llama_instr_encoder_free.argtypes = [ctypes.c_void_p]

encoder = ctypes.create_string_buffer(64)
enc = ctypes.addressof(encoder)
desc = Desc(b"gemma3", 0, 4, 192, 576, 512, 16)
assert lib.llama_instr_encoder_describe(enc, ctypes.byref(desc)) == 0
api.session_begin(None, log, "detailed", {})

def encode():
    t = lib.llama_instr_encode_begin(enc, 2)
    if t:
        lib.llama_instr_encode_end(enc, t, 4, 576, 0)
    return t != 0

# each allocation of one encode's begin and end failed in turn, until one encode reaches none
swept = 0
for n in range(1, 400):
    api.test_fail_alloc(n)
    encode()
    failed = api.test_failed_allocs()
    api.test_fail_alloc(0)
    if failed == 0:
        break
    swept += 1
recorded = encode()
os.rename(log, log + ".moved")
api.reopen()
reopened = encode()
try:
    api.session_end("ok")
except bindings.SessionError:
    pass  # it says the failed hooks lost records
lib.llama_instr_encoder_free(enc)
print(json.dumps({"swept": swept, "recorded": recorded, "reopened": reopened}))
"""


def test_an_encode_whose_start_failed_leaves_its_encoder_free(
    testing_lib: Path, tmp_path: Path
) -> None:
    log = tmp_path / "enc.log"
    out = run_on_lib(ENCODES, testing_lib, log)
    assert out["swept"] >= 3, out  # the sweep reached the begin's records, not only its join
    assert out["recorded"] and out["reopened"], out
    moved, now = read_log(Path(str(log) + ".moved")), read_log(log)
    # the file at the log's name after the reopen holds the last encode, whole, and the end
    ends = by_type(now, "step_end")
    assert len(ends) == 1 and by_type(now, "step_begin")[0]["kind"] == "encode"
    assert now[-1]["type"] == "session_end"
    # every encode recorded before it has its begin and its end, in order
    begins = [r["step"] for r in by_type(moved, "step_begin")]
    assert begins and begins == [r["step"] for r in by_type(moved, "step_end")]


LOADS = r"""
import ctypes, json, sys
from llamacpp_instr.native import bindings

log = sys.argv[1]
api = bindings.load()
lib = api.lib

class Media(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("nx", ctypes.c_uint32), ("ny", ctypes.c_uint32),
                ("n_frames", ctypes.c_int32), ("data", ctypes.c_char_p),
                ("n_bytes", ctypes.c_size_t), ("n_slices", ctypes.c_int32),
                ("n_tokens", ctypes.c_int32), ("n_pos", ctypes.c_int32),
                ("t_preprocess", ctypes.c_int64), ("bitmap", ctypes.c_void_p)]

lib.llama_instr_media_loaded.argtypes = [ctypes.c_void_p, ctypes.c_int64]
lib.llama_instr_media_unloaded.argtypes = [ctypes.c_void_p]
lib.llama_instr_media_add.argtypes = [ctypes.POINTER(Media)]
lib.llama_instr_media_add.restype = ctypes.c_int64
lib.llama_instr_clock.restype = ctypes.c_int64
A = ctypes.addressof(ctypes.create_string_buffer(16))
pixels = b"\x01\x02\x03" * 16

def loaded():
    t = lib.llama_instr_clock()
    lib.llama_instr_media_loaded(A, t)
    return t

def add():
    m = Media(0, 4, 4, 1, pixels, len(pixels), 1, 4, 4, 0, A)
    return lib.llama_instr_media_add(ctypes.byref(m))

starts = {}
starts["before"] = loaded()  # loaded before the session opened
api.session_begin(None, str(log), "detailed", {})
add()                        # 1: the load before the session
loaded()
lib.llama_instr_media_unloaded(A)
add()                        # 2: a new bitmap at a freed one's address, never loaded itself
loaded()
starts["newest"] = loaded()  # the same address loaded twice: the second is the bitmap added
add()                        # 3
loaded()                     # noted in this session, claimed by none
api.session_end("ok")
api.session_begin(None, str(log) + ".2", "detailed", {})
add()                        # 4: the note of the session before is another bitmap's
api.session_end("ok")
print(json.dumps(starts))
"""


def test_a_media_load_is_the_newest_of_its_own_bitmap(tmp_path: Path) -> None:
    from helpers.rpc_backend import lib_dir

    log = tmp_path / "media.log"
    starts = run_on_lib(LOADS, lib_dir(), log)
    media = by_type(read_log(log), "media") + by_type(read_log(Path(str(log) + ".2")), "media")
    assert len(media) == 4
    loads = [m.get("load", [None])[0] for m in media]
    assert loads == [starts["before"], None, starts["newest"], None]
