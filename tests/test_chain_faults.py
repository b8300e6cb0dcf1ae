"""A sampler chain's record and a context's counters where threads and allocation failures meet:
a chain freed while its record's allocation fails is never read again, and the session's end
writes the counters of a context another thread decoded without reading that context. Both run
in `.ci/sanitize` too (ASan and UBSan; TSan), where a read of freed memory is a report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.support import by_type, read_log, run_on_lib

pytestmark = pytest.mark.native

CHAIN_FREED = r"""
import json, sys
import llama_cpp
from llamacpp_instr.native import bindings

api = bindings.load()
lib = api.lib
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=128, n_threads=1, n_threads_batch=1,
                      verbose=False)
ctx = llm.ctx
assert lib.llama_instr_session_begin(ctx, sys.argv[2].encode(), 2, None) == 0
llm.eval([1, 2, 3])
failed = []
n = 0
while True:
    n += 1
    c = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(c, llama_cpp.llama_sampler_init_dist(n))
    llama_cpp.llama_sampler_sample(c, ctx, -1)
    api.test_fail_alloc(n)  # the n-th allocation of the chain's free fails
    llama_cpp.llama_sampler_free(c)
    failed.append(api.test_failed_allocs())
    api.test_fail_alloc(0)
    if failed[-1] == 0 or n > 200:
        break
assert lib.llama_instr_session_end(b"ok") == 0
llm.close()
print(json.dumps(failed))
"""


def test_a_chain_whose_record_could_not_be_made_is_not_read_at_the_end(
    testing_lib: Path, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """A chain sampled once, then freed while the n-th allocation of its free fails (n = 1, 2,
    ... until none is reached): each free that failed loses the chain's record, and the
    session's end writes no record of it (a chain still named there after its free would be read
    from freed memory, which ASan reports); every free that did not fail writes its one record."""
    log = tmp_path / "chains.log"
    failed = run_on_lib(CHAIN_FREED, testing_lib, tiny_llama_f32, log)
    if failed == [0]:
        # an unoptimized build's string and vector code is libstdc++'s own, allocating through its
        # operator new, which the testing build's (bound inside libllama) does not replace
        pytest.skip("no allocation of a chain's free reaches this build's injection")
    assert failed[0] >= 1 and failed[-1] == 0, failed  # a free failed, and the last one did not
    recs = read_log(log)
    assert by_type(recs, "session_end")[0]["status"] == "ok"
    chains = by_type(recs, "chain")
    assert len(chains) == failed.count(0), (failed, chains)
    assert all(c["samplers"] == ["dist"] and c["n_sample"] == 1 for c in chains)


COUNTERS_ELSEWHERE = r"""
import json, sys, threading
import llama_cpp
from llamacpp_instr.native import bindings

api = bindings.load()
lib = api.lib
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, n_threads=1, n_threads_batch=1,
                      verbose=False)
ctx = llm.ctx
assert lib.llama_instr_session_begin(None, sys.argv[2].encode(), 1, None) == 0
seen = {}


def worker():
    # each decode's outputs read, as a program reads them: llama.cpp counts a decode when the
    # context synchronizes (llama-cpp-python's eval alone never does)
    llm.eval([1, 2, 3, 4])
    llama_cpp.llama_get_logits(ctx)
    for t in range(5):
        llm.eval([5 + t])
        llama_cpp.llama_get_logits(ctx)
    d = llama_cpp.llama_perf_context(ctx)  # as llama.cpp counted the worker's last synchronization
    seen.update(n_p_eval=d.n_p_eval, n_eval=d.n_eval, t_eval_us=round(d.t_eval_ms * 1000))


th = threading.Thread(target=worker)
th.start()
th.join()
assert lib.llama_instr_session_end(b"ok") == 0  # on this thread, which never decoded ctx
llm.close()
print(json.dumps(seen))
"""


def test_the_end_writes_the_counters_of_a_context_another_thread_decoded(
    testing_lib: Path, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """A context decoded on a worker thread, the session ended on the main thread: its `perf`
    record holds llama.cpp's counters as the worker last saw them (llama_perf_context read on
    the worker after its last decode), kept at the worker's synchronization: the ending thread
    does not read a context another thread may be decoding. (The read itself is TSan's to see:
    test_native_robustness ends sessions while workers decode, under TSan in `.ci/sanitize`.)"""
    log = tmp_path / "perf.log"
    seen: dict[str, Any] = run_on_lib(COUNTERS_ELSEWHERE, testing_lib, tiny_llama_f32, log)
    [perf] = by_type(read_log(log), "perf")
    assert (perf["n_p_eval"], perf["n_eval"]) == (seen["n_p_eval"], seen["n_eval"]) == (4, 5)
    assert abs(perf["t_eval_us"] - seen["t_eval_us"]) <= 1


CHAIN_ELSEWHERE = r"""
import json, sys, threading, time
import llama_cpp
from llamacpp_instr.native import bindings

api = bindings.load()
lib = api.lib
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, n_threads=1, n_threads_batch=1,
                      verbose=False)
ctx = llm.ctx
chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(8))
llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(5))
first = (llama_cpp.llama_token * 3)(1, 2, 3)
assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(first, 3)) == 0
N = 60


def worker():
    for _ in range(N):
        one = (llama_cpp.llama_token * 1)(llama_cpp.llama_sampler_sample(chain, ctx, -1))
        assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(one, 1)) == 0


th = threading.Thread(target=worker)
th.start()
logs = []
while th.is_alive():  # sessions begun and ended on this thread while the worker samples
    logs.append(f"{sys.argv[2]}.{len(logs)}")
    assert lib.llama_instr_session_begin(None, logs[-1].encode(), 2, None) == 0
    time.sleep(0.005)
    assert lib.llama_instr_session_end(b"ok") == 0
th.join()
logs.append(f"{sys.argv[2]}.{len(logs)}")
assert lib.llama_instr_session_begin(None, logs[-1].encode(), 2, None) == 0
one = (llama_cpp.llama_token * 1)(7)
assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(one, 1)) == 0
llama_cpp.llama_sampler_sample(chain, ctx, -1)  # a step's output, sampled on this thread
assert lib.llama_instr_session_end(b"ok") == 0
n_sample = llama_cpp.llama_perf_sampler(chain).n_sample
llama_cpp.llama_sampler_free(chain)
print(json.dumps({"logs": logs, "n_sample": n_sample}))
"""


def test_sessions_ended_while_another_thread_samples_name_its_chain_whole(
    testing_lib: Path, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """Sessions begun and ended on the main thread while a worker samples with one chain and
    decodes: every log ends, each `chain` record the ends write holds llama.cpp's count as the
    sampling thread left it (never more than it sampled by then: the counts rise from log to log),
    and the last session, a step decoded and sampled on the ending thread, holds
    llama_perf_sampler's final count. Under TSan (`.ci/sanitize`) an end reading the chain while the worker samples is
    a report."""
    out = run_on_lib(CHAIN_ELSEWHERE, testing_lib, tiny_llama_f32, tmp_path / "s.log", timeout=600)
    assert out["n_sample"] == 61
    counts = []
    for path in out["logs"]:
        recs = read_log(Path(path))
        assert by_type(recs, "session_end")[0]["status"] == "ok"
        counts += [c["n_sample"] for c in by_type(recs, "chain")]
    assert counts and counts == sorted(counts) and counts[-1] == 61, counts
    assert all(0 < c <= 61 for c in counts)
