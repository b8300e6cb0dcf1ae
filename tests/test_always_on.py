"""Always on (issue 29), in a Python process: sampling (each step says its level, readers say what
was sampled and compute per-op figures from those steps only), bounded files (rotation between
steps, each file whole and readable alone, the series read as one session), reopening (SIGHUP,
llama_instr_reopen), a full disk (one warning, whole lines, writing resumes after a rotation),
and `instr serve`'s records of requests that failed or were cancelled. llama-server's side is in
test_tools_always_on.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import PROMPT, free_port, read_log, series, wait_ready, whole_lines

from llamacpp_instr.cli import main

ROOT = Path(__file__).resolve().parent.parent


def load_llama(model: Path) -> Any:
    import llama_cpp

    return llama_cpp.Llama(model_path=str(model), n_ctx=256, n_batch=64, n_threads=1, verbose=False)


def decode_requests(llm: Any, n: int, gen: int = 6) -> None:
    """``n`` prompts of 20 tokens, each followed by ``gen`` one-token steps."""
    for i in range(n):
        llm.reset()
        llm.eval([1] + [5 + (i + j) % 200 for j in range(19)])
        for t in range(gen):
            llm.eval([7 + (i + t) % 200])


# --- sampling -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sampled_log(
    instr_api: Any, tiny_llama_f32: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    import llamacpp_instr

    log = tmp_path_factory.mktemp("sampled") / "sampled.log"
    llm = load_llama(tiny_llama_f32)
    try:
        with llamacpp_instr.session(llm, log, "detailed", sample=4):
            decode_requests(llm, 3)
    finally:
        llm.close()
    return log


def test_one_step_in_n_is_detailed_and_each_says_its_level(
    sampled_log: Path, schema_validator: Any
) -> None:
    recs = read_log(sampled_log)
    for r in recs:
        schema_validator.validate(r)
    assert recs[0]["sample"] == {"steps": 4, "requests": 1}
    begins = [r for r in recs if r["type"] == "step_begin"]
    assert [b["step"] for b in begins] == list(range(len(begins))) and len(begins) == 21
    for b in begins:
        assert b["level"] == ("detailed" if b["step"] % 4 == 0 else "minimal")
        assert ("tokens" in b) == (b["level"] == "detailed")
    computes = [r for r in recs if r["type"] == "compute"]
    timed = {c["step"] for c in computes if c.get("ops")}
    assert timed == {b["step"] for b in begins if b["level"] == "detailed"}
    # every compute has its layer spans, sampled or not
    assert all(c["layers"] for c in computes)


def test_readers_say_what_was_sampled(sampled_log: Path) -> None:
    from llamacpp_instr import load_session
    from llamacpp_instr.converters.reports.summary import overview

    f = load_session(sampled_log)
    s = f.sampling()
    assert (s.sample_steps, s.timed_steps, s.steps) == (4, 6, 21)
    assert s.steps_by_level == {"detailed": 6, "minimal": 15}
    assert f.steps["level"].astype(str).tolist() == [
        "detailed" if i % 4 == 0 else "minimal" for i in range(21)
    ]
    # per-op figures come from the detailed steps only, and say so
    assert set(f.ops["step"]) == {0, 4, 8, 12, 16, 20}
    ov = overview(f)
    timed_dur = int(f.steps.loc[f.steps["step"] % 4 == 0, "dur_ns"].sum())
    assert ov["op_time_coverage"] == pytest.approx(f.ops["dur_ns"].sum() / timed_dur)
    assert ov["sampled"] == "1 step in 4 at detailed (6 of 21 steps with op times)"
    r = CliRunner().invoke(main, ["summary", str(sampled_log)])
    assert r.exit_code == 0, r.output
    assert "sampled:" in r.stdout and "per-op figures are from those steps" in r.stdout
    assert "Time per op type, the steps with op times: 1 step in 4" in r.stdout


def test_compare_never_sets_sampled_totals_against_full_ones(
    sampled_log: Path, instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    import llamacpp_instr
    from llamacpp_instr import load_session
    from llamacpp_instr.converters.reports import compare

    full = tmp_path / "full.log"
    llm = load_llama(tiny_llama_f32)
    try:
        with llamacpp_instr.session(llm, full, "detailed"):
            decode_requests(llm, 3)
    finally:
        llm.close()
    a, b = load_session(sampled_log), load_session(full)
    c = compare.compare_sessions(a, b, a.generated_tokens, b.generated_tokens)
    assert c["sampled"]["a"] and not c["sampled"]["b"]
    assert "unavailable" in c["tokens"]  # minimal steps carry no token ids
    # per op: the mean per step with op times, prompt and generation apart, in both runs
    mm = {r["op"]: r for r in c["per_op"]}["MUL_MAT"]
    for f, run in ((a, "a"), (b, "b")):
        for kind in ("prompt", "gen"):
            timed = f.steps[(f.steps["kind"] == kind) & (f.steps["level"] == "detailed")]["step"]
            ops = f.ops[f.ops["step"].isin(timed) & (f.ops["op"] == "MUL_MAT")]
            assert mm[f"{kind}_ms_{run}"] == pytest.approx(ops["dur_ns"].sum() / 1e6 / len(timed))
    r = CliRunner().invoke(main, ["compare", str(sampled_log), str(full)])
    assert r.exit_code == 0, r.output
    assert "prompt and generation apart" in r.stdout and "steps with op times" in r.stdout


def test_sample_requests_records_one_request_in_n(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    import llamacpp_instr

    log = tmp_path / "req.log"
    llm = load_llama(tiny_llama_f32)
    levels = []
    try:
        with llamacpp_instr.session(llm, log, "detailed", sample_requests=3):
            for i in range(5):
                instr_api.set_request(llm.ctx, f"r{i}")
                levels.append(instr_api.request_begin(llm.ctx))
                decode_requests(llm, 1, gen=2)
                instr_api.request_end(llm.ctx)
                instr_api.set_request(llm.ctx, None)
    finally:
        llm.close()
    assert levels == ["detailed", "minimal", "minimal", "detailed", "minimal"]
    begins = [r for r in read_log(log) if r["type"] == "step_begin"]
    assert len(begins) == 15
    for b in begins:
        assert b["level"] == ("detailed" if b["request"] in ("r0", "r3") else "minimal"), b


# --- bounded files ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rotated(instr_api: Any, tiny_llama_f32: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A detailed session of 40 requests rotated at 64K, every file kept."""
    import llamacpp_instr

    log = tmp_path_factory.mktemp("rotated") / "rot.log"
    llm = load_llama(tiny_llama_f32)
    try:
        with llamacpp_instr.session(llm, log, "detailed", max_bytes=64 * 1024, keep=100):
            decode_requests(llm, 40)
    finally:
        llm.close()
    return log


def test_every_file_is_whole_and_begins_the_session_again(
    rotated: Path, schema_validator: Any, tmp_path: Path
) -> None:
    from llamacpp_instr.converters.formats.convert import convert

    files = series(rotated)
    assert len(files) >= 4, files
    sid = None
    n_records = 0
    for k, f in enumerate(files):
        recs = whole_lines(f)
        n_records += len(recs)
        for r in recs:
            schema_validator.validate(r)
        head = recs[0]
        assert head["type"] == "session_start"
        sid = sid or head["sid"]
        assert head["sid"] == sid and head["rotate"] == {"max_bytes": 65536, "keep": 100}
        assert head.get("file", {}).get("index", 0) == k
        if k:
            assert head["file"]["records_before"] == n_records - len(recs)
            # a whole step or more past the size, never a piece of one
            assert f.stat().st_size >= 64 * 1024 or f == files[-1]
        # no rotation inside a step: each step begun in the file ends in it, and the reverse
        begun = [(r["ctx"], r["step"]) for r in recs if r["type"] == "step_begin"]
        ended = [(r["ctx"], r["step"]) for r in recs if r["type"] == "step_end"]
        assert begun == ended and begun
        # the graph tables its steps' ops refer to are in the file, before them
        seen: set[int] = set()
        for r in recs:
            if r["type"] == "graph":
                seen.add(r["graph"])
            elif r["type"] == "compute" and r.get("ops"):
                assert r["graph"] in seen, (f.name, r["step"])
        # and it converts alone, with nothing skipped (the base name reads the series: a copy)
        alone = tmp_path / f"{f.name}.alone"
        alone.write_bytes(f.read_bytes())
        stats, report = convert(alone, tmp_path / f"{f.name}.pftrace")
        assert report.skipped == [] and stats.steps == len(begun)
    last = whole_lines(files[-1])[-1]
    assert last["type"] == "session_end" and last["totals"]["records"] == n_records
    assert last["totals"]["lost"] == 0


def test_the_series_reads_as_one_session(rotated: Path, tmp_path: Path) -> None:
    from llamacpp_instr import load_session
    from llamacpp_instr.converters.reading.reader import log_files

    files = series(rotated)
    assert log_files(rotated) == files
    assert log_files(str(rotated) + "*") == files
    whole = load_session(rotated)
    assert whole.info.files == len(files) and whole.info.first_file == 0
    assert whole.steps["step"].tolist() == list(range(40 * 7))
    assert whole.info.ended and whole.report.skipped == []
    globbed = load_session(str(rotated) + "*")
    assert globbed.steps["dur_ns"].tolist() == whole.steps["dur_ns"].tolist()
    assert len(globbed.ops) == len(whole.ops) > 0
    # one file alone: its own steps, and it says where in the session it starts
    part = load_session(files[2])
    assert part.info.first_file == 2 and part.info.files == 1
    assert 0 < len(part.steps) < len(whole.steps)
    # a trace of the series, and the summary
    out = tmp_path / "series.pftrace"
    r = CliRunner().invoke(main, ["to-perfetto", str(rotated), "-o", str(out)])
    assert r.exit_code == 0 and out.stat().st_size > 0, r.output
    r = CliRunner().invoke(main, ["summary", str(rotated) + "*"])
    assert r.exit_code == 0, r.output
    # the facts' column is as wide as the longest label (a busy machine's verdict widens it)
    assert re.search(rf"^log files: +{len(files)} read as one", r.stdout, re.M), r.stdout
    assert re.search(r"^steps: +280$", r.stdout, re.M), r.stdout


def test_rotation_while_several_contexts_decode(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """Three threads decode on their own contexts while the log rotates: a new file waits for
    the steps open in the others, so every step is whole in one file, and each file holds the
    graph table of every graph its steps' ops use (per context)."""
    import threading

    import llamacpp_instr

    log = tmp_path / "multi.log"
    llms = [load_llama(tiny_llama_f32) for _ in range(3)]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            decode_requests(llms[i], 12)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    try:
        with llamacpp_instr.session(llms, log, "detailed", max_bytes=64 * 1024, keep=1000) as s:
            threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        for llm in llms:
            llm.close()
    assert not errors, errors
    files = series(log)
    assert len(files) >= 4, files
    n_steps = 0
    for f in files:
        recs = whole_lines(f)
        assert recs[0]["type"] == "session_start"
        begun = {(r["ctx"], r["step"]) for r in recs if r["type"] == "step_begin"}
        ended = {(r["ctx"], r["step"]) for r in recs if r["type"] == "step_end"}
        assert begun == ended, f.name
        n_steps += len(ended)
        seen: set[tuple[int, int]] = set()
        for r in recs:
            if r["type"] == "graph":
                seen.add((r["ctx"], r["graph"]))
            elif r["type"] == "compute" and r.get("ops"):
                assert (r["ctx"], r["graph"]) in seen, (f.name, r["ctx"], r["step"])
        assert sum(r["type"] == "session_start" for r in recs) == 1
    assert n_steps == s.totals.steps == 3 * 12 * 7
    last = whole_lines(files[-1])[-1]
    assert last["type"] == "session_end" and last["totals"]["lost"] == 0


def test_keep_removes_the_oldest(instr_api: Any, tiny_llama_f32: Path, tmp_path: Path) -> None:
    import llamacpp_instr
    from llamacpp_instr import load_session

    log = tmp_path / "keep.log"
    llm = load_llama(tiny_llama_f32)
    try:
        with llamacpp_instr.session(llm, log, "detailed", max_bytes=64 * 1024, keep=2) as s:
            decode_requests(llm, 30)
    finally:
        llm.close()
    files = series(log)
    assert [f.name for f in files] == ["keep.log.2", "keep.log.1", "keep.log"]
    first = whole_lines(files[0])[0]["file"]["index"]
    assert first >= 2 and [whole_lines(f)[0]["file"]["index"] for f in files] == [
        first,
        first + 1,
        first + 2,
    ]
    f = load_session(log)
    assert f.info.first_file == first and s.totals.steps == 30 * 7
    assert f.steps["step"].iloc[-1] == 30 * 7 - 1 and len(f.steps) < 30 * 7


def test_reopen_starts_a_new_file_at_the_path(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """What logrotate does: move the log away, then ask for a reopen (SIGHUP runs the same)."""
    import llamacpp_instr

    log = tmp_path / "hup.log"
    moved = tmp_path / "hup.log-old"
    llm = load_llama(tiny_llama_f32)
    try:
        with llamacpp_instr.session(llm, log, "detailed"):
            decode_requests(llm, 2)
            log.rename(moved)
            llamacpp_instr.running.api.reopen()
            decode_requests(llm, 2)
    finally:
        llm.close()
    old, new = whole_lines(moved), whole_lines(log)
    assert old[-1]["type"] == "step_end" and new[0]["type"] == "session_start"
    assert new[0]["file"]["index"] == 1 and new[-1]["type"] == "session_end"
    assert new[-1]["totals"]["lost"] == 0
    steps = [r["step"] for r in old + new if r["type"] == "step_begin"]
    assert steps == list(range(28))
    # the first step in the new file wrote its graph table again
    assert any(r["type"] == "graph" for r in new)


def test_reopen_when_idle_is_done_by_the_flusher(instr_api: Any, tmp_path: Path) -> None:
    log = tmp_path / "idle.log"
    instr_api.session_begin(None, str(log), "minimal", {})
    try:
        log.rename(tmp_path / "idle.log.1")
        instr_api.reopen()
        t_end = time.monotonic() + 5
        while not log.exists() and time.monotonic() < t_end:
            time.sleep(0.02)
        assert log.exists()
    finally:
        instr_api.session_end("ok")
    recs = whole_lines(log)
    assert [r["type"] for r in recs] == ["session_start", "session_end"]


def test_sampling_and_rotation_are_the_next_sessions_only(instr_api: Any, tmp_path: Path) -> None:
    """Set for one session, they do not carry over into the next one begun without them."""
    import llamacpp_instr

    with llamacpp_instr.session(None, tmp_path / "a.log", "detailed", sample=4, max_bytes=1 << 20):
        pass
    instr_api.session_begin(None, str(tmp_path / "b.log"), "detailed", {})
    instr_api.session_end("ok")
    a, b = read_log(tmp_path / "a.log")[0], read_log(tmp_path / "b.log")[0]
    assert a["sample"]["steps"] == 4 and a["rotate"]["max_bytes"] == 1 << 20
    assert "sample" not in b and "rotate" not in b


# --- a full disk --------------------------------------------------------------------------------


def test_a_full_disk_suspends_writing_until_a_rotation(
    instr_api: Any, tiny_llama_f32: Path, small_tmpfs: Path, tmp_path: Path
) -> None:
    """In a child process (its stderr is the warning): decode, fill the disk, decode (records
    dropped, one warning), free the space, decode on until the log rotates (writing resumes)."""
    log = small_tmpfs / "full.log"
    filler = small_tmpfs / "filler"
    script = f"""
import sys
sys.path.insert(0, {str(ROOT / "tests")!r})
from pathlib import Path
from helpers.support import fill
from test_always_on import decode_requests, load_llama
import llamacpp_instr
llm = load_llama(Path({str(tiny_llama_f32)!r}))
try:
    with llamacpp_instr.session(llm, {str(log)!r}, "detailed", max_bytes=64 * 1024, keep=8):
        decode_requests(llm, 2)
        fill(Path({str(filler)!r}))
        decode_requests(llm, 6)
        print("decoded while full", flush=True)
        Path({str(filler)!r}).unlink()
        decode_requests(llm, 12)
except Exception as exc:
    print("session end:", exc, flush=True)
llm.close()
"""
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert "decoded while full" in r.stdout, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("llama-instr: ")]
    assert warnings[0].startswith(f"llama-instr: writing the log {log} failed: No space left")
    assert warnings[0].endswith("records are dropped until the log is reopened or rotated")
    # one line when writing stops, one when it resumes, never a line per record (nor per try:
    # a rotation while the disk is still full stays silent)
    assert len(warnings) == 2, r.stderr
    assert " again (" in warnings[1] and warnings[1].endswith("records were lost)"), r.stderr
    # the session reports what it lost, and every file is whole lines
    assert "session end:" in r.stdout and "records lost" in r.stdout
    files = series(log)
    assert len(files) >= 2
    for f in files:
        assert whole_lines(f)[0]["type"] == "session_start"
    # no file was lost to a rotation tried while the disk was full: the log is at its path and
    # the series in order (a file whose head could not be written is not rotated into it, so
    # its index is skipped)
    assert files[-1].name == "full.log"
    indices = [whole_lines(f)[0].get("file", {}).get("index", 0) for f in files]
    assert indices == sorted(set(indices)), ([f.name for f in files], indices)
    last = whole_lines(files[-1])
    assert last[-1]["type"] == "session_end" and last[-1]["totals"]["lost"] > 0
    # writing resumed: the steps after the space came back are in the log, whole
    assert sum(r["type"] == "step_end" for r in last) >= 1


def test_a_rotation_that_cannot_open_loses_no_file(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """No descriptor left (EMFILE) when the log is due to rotate: the series stays as it is, the
    log is written on, and rotation resumes once descriptors are back (issue 35). Before the fix
    LOG was renamed to LOG.1 first, writing went on into LOG.1, each retry shifted the series and
    LOG never existed again. In a child process: its descriptor limit is lowered and restored."""
    log = tmp_path / "emfile.log"
    script = f"""
import json, os, resource, sys, time
sys.path.insert(0, {str(ROOT / "tests")!r})
from pathlib import Path
from test_always_on import decode_requests, load_llama
import llamacpp_instr
llm = load_llama(Path({str(tiny_llama_f32)!r}))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
log = Path({str(log)!r})
def names():
    return sorted(p.name for p in log.parent.iterdir() if p.name.startswith(log.name))
with llamacpp_instr.session(llm, str(log), "detailed", max_bytes=64 * 1024, keep=50) as s:
    decode_requests(llm, 6)
    before = names()
    # every descriptor number up to the limit in use: no file can be opened
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) - 1, hard))
    decode_requests(llm, 12)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # (listing a folder takes one too)
    print("while out of descriptors:", json.dumps([before, names()]), flush=True)
    time.sleep(10.5)  # a failed rotation is tried again 10 s later
    decode_requests(llm, 12)
print("steps", s.totals.steps, flush=True)
"""
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("while out of descriptors:"))
    before, during = json.loads(line.split(": ", 1)[1])
    # it did rotate before the limit (so the test is about a rotation), and not while out of
    # descriptors: every file is where it was, the log still at its path
    assert len(before) >= 3 and "emfile.log" in before
    assert during == before, (before, during)
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("llama-instr: ")]
    assert warnings and all("cannot rotate the log" in w for w in warnings), r.stderr
    assert all(w.endswith("writing on to the file open") for w in warnings), r.stderr
    # rotation resumed: a series with no gap, each file whole and starting the session, the
    # newest at LOG ending it, and every step of the session in the files kept
    files = series(log)
    assert len(files) > len(before)
    assert [f.name for f in files][-1] == "emfile.log"
    indices = [whole_lines(f)[0]["file"]["index"] for f in files if "file" in whole_lines(f)[0]]
    assert indices == list(range(indices[0], indices[0] + len(indices)))
    assert whole_lines(files[-1])[-1]["type"] == "session_end"
    assert whole_lines(files[-1])[-1]["totals"]["lost"] == 0
    # the file written while rotation could not happen grew past max_bytes, but only until the
    # retry: no file holds more than the steps of those 12 requests
    assert max(f.stat().st_size for f in files) < 8 * 64 * 1024


def rename_shim(tmp_path: Path) -> Path:
    """tests/native/rename_fail.c built as an LD_PRELOAD library: one rename to a name ending with
    $RENAME_FAIL_SUFFIX fails with EIO each time the file $RENAME_FAIL_ARM is created."""
    import shutil

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    lib = tmp_path / "rename_fail.so"
    src = ROOT / "tests" / "native" / "rename_fail.c"
    r = subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", str(src), "-o", str(lib), "-ldl"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return lib


def test_a_failed_rename_in_a_rotation_loses_no_kept_file(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """keep=3, and the rename of the file open to LOG.1 fails once (EIO, an LD_PRELOAD shim) at a
    rotation with the series full: every kept file stays, by content, the log is written on, and the
    retry 10 s later rotates. Before the fix the series was shifted first and the rollback restored
    only the file open: LOG.3's content was gone and LOG.1 missing, one more file per retry."""
    log = tmp_path / "shim.log"
    arm = tmp_path / "arm"
    script = f"""
import hashlib, json, sys, time
sys.path.insert(0, {str(ROOT / "tests")!r})
from pathlib import Path
from test_always_on import decode_requests, load_llama
import llamacpp_instr
llm = load_llama(Path({str(tiny_llama_f32)!r}))
log, arm = Path({str(log)!r}), Path({str(arm)!r})
def kept():
    return {{p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in log.parent.iterdir() if p.name.startswith(log.name + ".")}}
with llamacpp_instr.session(llm, str(log), "detailed", max_bytes=64 * 1024, keep=3) as s:
    decode_requests(llm, 20)
    before = kept()
    arm.touch()
    for _ in range(40):  # one request at a time until the rename was tried (and failed)
        decode_requests(llm, 1)
        if not arm.exists():
            break
    print("after the failure:", json.dumps([before, kept(), log.exists(), arm.exists()]), flush=True)
    time.sleep(10.5)  # a failed rotation is tried again 10 s later
    decode_requests(llm, 12)
print("steps", s.totals.steps, flush=True)
"""
    # after any preload already there (a sanitizer's runtime must come first)
    preload = [p for p in (os.environ.get("LD_PRELOAD"), str(rename_shim(tmp_path))) if p]
    env = dict(
        os.environ,
        LD_PRELOAD=":".join(preload),
        RENAME_FAIL_ARM=str(arm),
        RENAME_FAIL_SUFFIX="shim.log.1",
    )
    r = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("after the failure:"))
    before, after, at_path, armed = json.loads(line.split(": ", 1)[1])
    assert sorted(before) == ["shim.log.1", "shim.log.2", "shim.log.3"], before
    assert not armed, "no rename to shim.log.1 was tried"
    assert after == before, (before, after)
    assert at_path
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("llama-instr: ")]
    assert any(
        "cannot rotate the log" in w and "Input/output error" in w for w in warnings
    ), r.stderr
    # the retry rotated: a full series, each file whole and beginning the session, their indices
    # without a gap, the newest ending the session with nothing lost
    files = series(log)
    assert [f.name for f in files] == ["shim.log.3", "shim.log.2", "shim.log.1", "shim.log"]
    heads = [whole_lines(f)[0] for f in files]
    assert all(h["type"] == "session_start" for h in heads)
    indices = [h["file"]["index"] for h in heads]
    assert indices == list(range(indices[0], indices[0] + 4)), indices
    last = whole_lines(files[-1])[-1]
    assert last["type"] == "session_end" and last["totals"]["lost"] == 0


def test_a_rotation_that_keeps_failing_moves_no_kept_file(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """keep=3, and every rename to LOG.1 fails (EIO, an LD_PRELOAD shim) from the 4th on: the
    three rotations that fill the series succeed, then each try (the first, and the retries 10 s
    apart) fails. However often it is tried, every kept file stays where it was with its content,
    no name a rotation uses is left behind, the log is written on whole, and one warning says so.
    A shift of the series whose undo renames into LOG.1 itself moves and drops kept files at each
    try."""
    log = tmp_path / "keep.log"
    failed = tmp_path / "failed-renames"
    script = f"""
import hashlib, json, sys, time
sys.path.insert(0, {str(ROOT / "tests")!r})
from pathlib import Path
from test_always_on import decode_requests, load_llama
import llamacpp_instr
llm = load_llama(Path({str(tiny_llama_f32)!r}))
log = Path({str(log)!r})
def kept():
    return {{p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in log.parent.iterdir() if p.name.startswith(log.name + ".")}}
with llamacpp_instr.session(llm, str(log), "detailed", max_bytes=64 * 1024, keep=3) as s:
    for _ in range(80):  # one request at a time until the third rotation filled the series
        decode_requests(llm, 1)
        if Path(str(log) + ".3").exists():
            break
    before = kept()
    failed = Path({str(failed)!r})
    def tries():
        return len(failed.read_text().splitlines()) if failed.exists() else 0
    for _ in range(80):  # until the first try failed
        decode_requests(llm, 1)
        if tries():
            break
    for _ in range(2):  # two retries, 10 s apart (idle meanwhile)
        n = tries()
        time.sleep(10.2)
        for _ in range(20):
            decode_requests(llm, 1)
            if tries() > n:
                break
    after = kept()
print("kept:", json.dumps([before, after]), flush=True)
"""
    preload = [p for p in (os.environ.get("LD_PRELOAD"), str(rename_shim(tmp_path))) if p]
    env = dict(
        os.environ,
        LD_PRELOAD=":".join(preload),
        RENAME_FAIL_SUFFIX="keep.log.1",
        RENAME_FAIL_FROM="4",
        RENAME_FAIL_LOG=str(failed),
    )
    r = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("kept:"))
    before, after = json.loads(line.split(": ", 1)[1])
    assert sorted(before) == ["keep.log.1", "keep.log.2", "keep.log.3"], before
    assert after == before, (before, after)
    # the rotation was tried at least three times (each try fails at least one rename), and
    # every name it uses on the way is gone: the folder holds the series and nothing else
    tries = failed.read_text().splitlines()
    assert len(tries) >= 3 and all(t.endswith(" -> " + str(log) + ".1") for t in tries), tries
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("keep.log"))
    assert names == ["keep.log", "keep.log.1", "keep.log.2", "keep.log.3"], names
    assert {n: hashlib.sha256((tmp_path / n).read_bytes()).hexdigest() for n in names[1:]} == before
    # one warning for a rotation that cannot finish, not one per try
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("llama-instr: ")]
    assert len(warnings) == 1, r.stderr
    assert "cannot rotate the log" in warnings[0] and "Input/output error" in warnings[0]
    # the log was written on, past max_bytes, whole, to the session's end with nothing lost
    assert log.stat().st_size > 64 * 1024
    recs = whole_lines(log)
    assert recs[0]["type"] == "session_start" and recs[0]["file"]["index"] == 3
    assert recs[-1]["type"] == "session_end" and recs[-1]["totals"]["lost"] == 0


def test_a_rotation_cut_short_is_put_back_before_the_next(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """The names a rotation with keep=3 leaves when its process dies just before its new file
    takes the log's name (LOG C, LOG.1 A, LOG.2 B before it): LOG.3 and LOG.2 already hold B and
    A, LOG.1 the file of LOG, A and B have their second names LOG.1.old and LOG.2.old, and the
    new file is LOG.new. The next rotation (a session writing on to LOG) first puts the series
    back as it was, then rotates it: B at LOG.3, A at LOG.2, LOG's file at LOG.1, nothing else
    left. A rotation that took the names left for the series would move B out of it (LOG.3
    holding A, and LOG.2 the same file as LOG.1)."""
    import llamacpp_instr

    log = tmp_path / "cut.log"
    name = {k: tmp_path / f"cut.log.{k}" for k in (1, 2, 3)}
    log.write_text('{"file": "C"}\n')
    (tmp_path / "cut.log.1.old").write_text('{"file": "A"}\n')
    (tmp_path / "cut.log.2.old").write_text('{"file": "B"}\n')
    os.link(tmp_path / "cut.log.2.old", name[3])
    os.link(tmp_path / "cut.log.1.old", name[2])
    os.link(log, name[1])
    (tmp_path / "cut.log.new").touch()
    llm = load_llama(tiny_llama_f32)
    try:
        with llamacpp_instr.session(llm, log, "detailed", max_bytes=64 * 1024, keep=3):
            for _ in range(40):  # one request at a time until the first rotation
                decode_requests(llm, 1)
                if not (tmp_path / "cut.log.new").exists():
                    break
            names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("cut.log"))
            kept = {k: p.read_text() for k, p in name.items()}
    finally:
        llm.close()
    assert names == ["cut.log", "cut.log.1", "cut.log.2", "cut.log.3"], names
    assert kept[3] == '{"file": "B"}\n' and kept[2] == '{"file": "A"}\n', kept
    lines = kept[1].splitlines()
    assert lines[0] == '{"file": "C"}' and json.loads(lines[1])["type"] == "session_start"
    assert len({p.stat().st_ino for p in [log, *name.values()]}) == 4


def test_a_log_removed_under_the_session_loses_no_kept_file(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """The live file removed (by hand, no SIGHUP) while the session rotates with keep=3 (issue 55
    §1): the rotation due next finds it gone, leaves every kept file where it is and opens the
    path anew; the session ends saying that the removed file's records are lost. Before the fix the
    series was shifted before the rename of the missing file failed: each try (every 10 s) lost the
    oldest kept file, and LOG never came back."""
    import llamacpp_instr
    from llamacpp_instr.native.bindings import SessionError

    log = tmp_path / "gone.log"

    def kept() -> dict[str, tuple[int, str]]:
        return {
            p.name: (p.stat().st_ino, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in tmp_path.iterdir()
            if p.name.startswith("gone.log.")
        }

    llm = load_llama(tiny_llama_f32)
    try:
        with pytest.raises(SessionError, match="was removed while the session was open"):
            with llamacpp_instr.session(llm, log, "detailed", max_bytes=64 * 1024, keep=3):
                decode_requests(llm, 20)
                before = kept()
                assert sorted(before) == ["gone.log.1", "gone.log.2", "gone.log.3"]
                log.unlink()
                # one request at a time until a rotation was due (and tried) since the removal
                for _ in range(40):
                    decode_requests(llm, 1)
                    if log.exists() or kept() != before:
                        break
                after = kept()
                back = log.exists()
    finally:
        llm.close()
    assert after == before, (sorted(before), sorted(after))
    assert back, "the path was not opened anew"
    # the new file begins the session again, and its end says why
    recs = whole_lines(log)
    assert recs[0]["type"] == "session_start" and recs[0]["file"]["index"] > 0
    assert recs[-1]["type"] == "session_end"


# --- options ------------------------------------------------------------------------------------


@pytest.mark.fast
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--keep", "3"], "--keep needs --max-bytes"),
        (["--max-bytes", "1K"], "--max-bytes must be at least 64K"),
        (["--max-bytes", "64X"], "not a size: '64X'"),
        (["--sample", "0"], "--sample"),
    ],
)
def test_bad_always_on_options_are_usage_errors(args: list[str], message: str) -> None:
    for cmd in (["run", "-p", "hi"], ["serve"], ["exec"]):
        r = CliRunner().invoke(main, cmd + args + (["llama-server"] if cmd == ["exec"] else []))
        assert r.exit_code == 2, (cmd, r.output)
        assert message in r.stderr, (cmd, r.stderr)


def test_run_samples_and_rotates(tiny_llama_f32: Path, tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    r = CliRunner().invoke(
        main,
        ["run", str(tiny_llama_f32), "-p", PROMPT, "-n", "8", "-t", "1", "-o", str(log)]
        + ["--sample", "2", "--max-bytes", "64K", "--keep", "2"],
    )
    assert r.exit_code == 0, r.output
    recs = read_log(log)
    assert recs[0]["sample"]["steps"] == 2 and recs[0]["rotate"] == {"max_bytes": 65536, "keep": 2}
    assert recs[0]["metadata"]["config"]["always_on"]["sample"] == 2
    levels = [r["level"] for r in recs if r["type"] == "step_begin"]
    assert levels == ["detailed", "minimal"] * 4


def test_the_environment_takes_them_and_refuses_bad_values(
    tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """LLAMA_INSTR_SAMPLE, _MAX_BYTES and _KEEP in any process linking libllama (here Python)."""
    script = (
        "import llama_cpp, sys; "
        f"llm = llama_cpp.Llama({str(tiny_llama_f32)!r}, n_ctx=64, n_threads=1, verbose=False); "
        "llm.eval([1, 5, 6, 7]); llm.eval([8]); llm.eval([9]); print('ok')"
    )
    log = tmp_path / "env.log"
    env = dict(os.environ, LLAMA_INSTR_LOG=str(log), LLAMA_INSTR_SAMPLE="3")
    env.update(LLAMA_INSTR_MAX_BYTES="1M", LLAMA_INSTR_KEEP="4")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    recs = read_log(log)
    assert recs[0]["sample"] == {"steps": 3, "requests": 1}
    assert recs[0]["rotate"] == {"max_bytes": 1 << 20, "keep": 4}
    assert [r["level"] for r in recs if r["type"] == "step_begin"] == [
        "detailed",
        "minimal",
        "minimal",
    ]
    for bad, says in (
        ({"LLAMA_INSTR_SAMPLE": "zero"}, "LLAMA_INSTR_SAMPLE=zero is not a number"),
        ({"LLAMA_INSTR_MAX_BYTES": "12"}, "LLAMA_INSTR_MAX_BYTES=12 is not a size of at least 64K"),
        ({"LLAMA_INSTR_KEEP": "3"}, "LLAMA_INSTR_KEEP needs LLAMA_INSTR_MAX_BYTES"),
    ):
        bad_log = tmp_path / "bad.log"
        env = dict(os.environ, LLAMA_INSTR_LOG=str(bad_log), **bad)
        r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
        assert r.returncode == 0 and "ok" in r.stdout, r.stderr
        assert f"llama-instr: {says}" in r.stderr and "running uninstrumented" in r.stderr
        assert not bad_log.exists()


# --- instr serve: every request, whatever became of it --------------------------------------------


@pytest.fixture(scope="module")
def served(instr_api: Any, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """instr serve with --sample-requests 2: completions, a bad request, a stream the client
    drops after its first tokens, SIGHUP after the log was moved, then SIGINT."""
    import urllib.error
    import urllib.request

    import openai

    tmp = tmp_path_factory.mktemp("serve-always")
    log = tmp / "serve.log"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llamacpp_instr.cli", "serve", str(smollm2_path)]
        + ["--port", str(port), "-o", str(log), "-t", "2", "--sample-requests", "2"],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}/v1"
    sent: list[str] = []
    try:
        wait_ready(port, proc)
        client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
        for i in range(2):
            client.completions.create(
                model="smollm2", prompt=f"Count to {i + 3}:", max_tokens=4, temperature=0
            )
            sent.append("ok")
        # a request the server refuses (422: not a completion request)
        req = urllib.request.Request(
            f"{base}/completions",
            data=json.dumps({"prompt": 5, "max_tokens": "many"}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=60)
        refused_status = refused.value.code  # (llama-cpp-python answers a bad body with 500)
        assert refused_status >= 400
        sent.append("error")
        # a stream the client drops after two chunks
        stream = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Tell a long story."}],
            max_tokens=200,
            temperature=0,
            stream=True,
        )
        got = 0
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                got += 1
                if got == 2:
                    break
        stream.close()
        sent.append("cancelled")
        time.sleep(1.0)
        # logrotate: move the log, then SIGHUP
        moved = tmp / "serve.log.moved"
        log.rename(moved)
        proc.send_signal(signal.SIGHUP)
        client.completions.create(model="smollm2", prompt="Hi", max_tokens=3, temperature=0)
        sent.append("ok")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return {
        "log": log,
        "moved": moved,
        "sent": sent,
        "refused_status": refused_status,
        "err": err,
        "rc": proc.returncode,
    }


def test_serve_records_every_request_with_its_outcome(served: Any, schema_validator: Any) -> None:
    assert served["rc"] == 0, served["err"]
    recs = whole_lines(served["moved"]) + whole_lines(served["log"])
    for r in recs:
        schema_validator.validate(r)
    # in the order the client sent them (one after the other)
    posts = sorted(
        (r for r in recs if r["type"] == "request" and r["method"] == "POST"),
        key=lambda r: r["t_arrive"],
    )
    assert [r["outcome"] for r in posts] == served["sent"]
    ok, error, cancelled = posts[0], posts[2], posts[3]
    assert ok["status"] == 200 and "error" not in ok
    assert error["status"] == served["refused_status"] and error["ttft"] is None
    assert cancelled["status"] == 200 and cancelled["stream"]
    assert cancelled["tokens_sent"] >= 2 and cancelled["dur"] > 0
    # --sample-requests 2: the requests that reached the model alternate detailed and minimal
    reached = [r for r in posts if r["outcome"] != "error"]
    assert [r["level"] for r in reached] == ["detailed", "minimal", "detailed", "minimal"]
    steps = [r for r in recs if r["type"] == "step_begin"]
    for r in reached:
        mine = {s["level"] for s in steps if s.get("request") == r["id"]}
        assert mine == {r["level"]}, r["id"]


def test_serve_reopens_its_log_on_sighup(served: Any) -> None:
    new = whole_lines(served["log"])
    assert new[0]["type"] == "session_start" and new[0]["file"]["index"] == 1
    assert new[-1]["type"] == "session_end" and new[-1]["status"] == "interrupted"
    assert new[-1]["totals"]["lost"] == 0
    # the request made after SIGHUP is in the new file (the dropped stream's record may be too:
    # the server notices the client left at its next chunk)
    reqs = [r for r in new if r["type"] == "request"]
    assert reqs and reqs[-1]["outcome"] == "ok" and reqs[-1]["endpoint"] == "/v1/completions"
