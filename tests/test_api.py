"""The Python API (`llamacpp_instr.session`) around real llama_cpp.Llama objects, and batches that
carry several sequences (llama-cpp-python's low-level API)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import llamacpp_instr
from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import bindings


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.open(encoding="utf-8")]


def steps_of(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in recs if r["type"] == "step_begin"]


def llama(model: Path, **kw: Any) -> Any:
    import llama_cpp

    return llama_cpp.Llama(str(model), n_ctx=256, n_batch=64, n_threads=2, verbose=False, **kw)


def test_everything_the_llama_does_is_logged(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    llm = llama(tiny_llama_f32)
    log = tmp_path / "api.log"
    try:
        with llamacpp_instr.session(llm, log) as s:
            assert s.status == "open" and s.path == log
            llm("abc", max_tokens=3)
            n1 = s.totals.steps
            llm.create_completion("xyz", max_tokens=2, temperature=0.0)
            n2 = s.totals.steps
            chunks = list(llm.create_completion("hello", max_tokens=4, stream=True))
            n3 = s.totals.steps
            llm.create_chat_completion(messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            n4 = s.totals.steps
    finally:
        llm.close()
    assert 0 < n1 < n2 < n3 < n4
    assert len(chunks) >= 1
    recs = records(log)
    assert (
        recs[0]["type"] == "session_start"
        and recs[0]["metadata"]["api"] == "llamacpp_instr.session"
    )
    assert recs[-1]["type"] == "session_end" and recs[-1]["status"] == "ok"
    assert s.status == "ok" and s.totals.steps == len(steps_of(recs)) == n4
    assert recs[-1]["totals"]["steps"] == n4 and recs[-1]["totals"]["lost"] == 0
    # every step decoded on the one context, as session_start's context
    assert {r["ctx"] for r in steps_of(recs)} == {1}


def test_embeddings_and_a_second_llama_in_one_session(
    instr_api: Any, tiny_llama_f32: Path, tiny_second_arch: Path, tmp_path: Path
) -> None:
    gen = llama(tiny_llama_f32)
    emb = llama(tiny_second_arch, embedding=True)
    log = tmp_path / "two.log"
    try:
        with llamacpp_instr.session([gen, emb], log):
            gen("abc", max_tokens=2)
            vec = emb.embed("some text to embed")
        n_text = len(emb.tokenize(b"some text to embed"))
    finally:
        gen.close()
        emb.close()
    assert len(vec) > 0
    recs = records(log)
    by_ctx: dict[int, int] = {}
    for r in steps_of(recs):
        by_ctx[r["ctx"]] = by_ctx.get(r["ctx"], 0) + 1
    assert sorted(by_ctx) == [1, 2]  # one context id each
    # the embedding decodes the text's tokens
    emb_steps = [r for r in steps_of(recs) if r["ctx"] == 2]
    assert emb_steps and sum(r["n_tokens"] for r in emb_steps) == n_text


def test_a_second_session_while_one_is_open_is_an_error(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    llm = llama(tiny_llama_f32)
    try:
        with llamacpp_instr.session(llm, tmp_path / "a.log"):
            with pytest.raises(UserError, match="a session is already open"):
                with llamacpp_instr.session(llm, tmp_path / "b.log"):
                    pass
            llm("abc", max_tokens=1)
    finally:
        llm.close()
    assert not (tmp_path / "b.log").exists()
    assert records(tmp_path / "a.log")[-1]["status"] == "ok"


@pytest.mark.parametrize(
    "exc, status", [(RuntimeError("boom"), "error"), (KeyboardInterrupt(), "interrupted")]
)
def test_an_exception_ends_the_session_with_its_status(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path, exc: BaseException, status: str
) -> None:
    llm = llama(tiny_llama_f32)
    log = tmp_path / "x.log"
    try:
        with pytest.raises(type(exc)):
            with llamacpp_instr.session(llm, log, level="minimal") as s:
                llm("abc", max_tokens=2)
                raise exc
    finally:
        llm.close()
    recs = records(log)
    assert recs[-1]["type"] == "session_end" and recs[-1]["status"] == status == s.status
    assert instr_api.get_level() == 0


@pytest.mark.fast
def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="level must be one of"):
        with llamacpp_instr.session(None, tmp_path / "x.log", level="loud"):
            pass
    with pytest.raises(UserError, match="not a llama_cpp.Llama"):
        with llamacpp_instr.session(object(), tmp_path / "x.log"):
            pass
    assert not (tmp_path / "x.log").exists()


@pytest.mark.fast
def test_load_session_and_to_perfetto_are_importable() -> None:
    from llamacpp_instr import load_session

    assert callable(load_session) and callable(llamacpp_instr.session)


# --- batches with several sequences --------------------------------------------------------------


class LowLevel:
    """A model and a context made with llama-cpp-python's low-level API (n_seq_max as given)."""

    def __init__(self, model: Path, n_seq_max: int) -> None:
        import llama_cpp

        self.lib = llama_cpp
        self.model = llama_cpp.llama_model_load_from_file(
            str(model).encode(), llama_cpp.llama_model_default_params()
        )
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_seq_max, cp.n_threads = 256, 64, n_seq_max, 2
        self.ctx = llama_cpp.llama_init_from_model(self.model, cp)
        assert self.model and self.ctx

    def decode(self, seqs: dict[int, list[tuple[int, int]]]) -> None:
        """Decode one batch: for each sequence id, its (token, position) pairs."""
        n = sum(len(v) for v in seqs.values())
        batch = self.lib.llama_batch_init(n, 0, 1)
        try:
            k = 0
            for seq, toks in seqs.items():
                for i, (tok, pos) in enumerate(toks):
                    batch.token[k], batch.pos[k], batch.n_seq_id[k] = tok, pos, 1
                    batch.seq_id[k][0] = seq
                    batch.logits[k] = i == len(toks) - 1
                    k += 1
            batch.n_tokens = n
            assert self.lib.llama_decode(self.ctx, batch) == 0
        finally:
            self.lib.llama_batch_free(batch)

    def close(self) -> None:
        self.lib.llama_free(self.ctx)
        self.lib.llama_model_free(self.model)


def test_a_batch_of_several_sequences_is_recorded_per_sequence(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """Three sequences in one llama_batch, as parallel decoding builds it: step_begin says, per
    sequence id, how many tokens and which positions; load_session has them as a table."""
    prompts = {0: [1, 40, 41, 42, 43], 1: [1, 50, 51], 2: [1, 60, 61, 62, 63, 64, 65]}
    log = tmp_path / "seqs.log"
    ll = LowLevel(tiny_llama_f32, n_seq_max=4)
    try:
        with llamacpp_instr.session(None, log):
            ll.decode({s: [(t, i) for i, t in enumerate(toks)] for s, toks in prompts.items()})
            # then one generated token per sequence, in one batch
            ll.decode({s: [(70 + s, len(toks))] for s, toks in prompts.items()})
    finally:
        ll.close()
    first, second = steps_of(records(log))
    n = sum(len(t) for t in prompts.values())
    assert first["seqs"] == [[s, len(t), 0, len(t) - 1] for s, t in prompts.items()]
    assert first["n_tokens"] == n and first["pos"] == [0, 6]
    assert second["seqs"] == [[s, 1, len(t), len(t)] for s, t in prompts.items()]
    # load_session has them as a table
    from llamacpp_instr import load_session

    f = load_session(log)
    assert f.seqs[["step", "seq", "n_tokens", "pos0", "pos1"]].values.tolist() == [
        [0, s, len(t), 0, len(t) - 1] for s, t in prompts.items()
    ] + [[1, s, 1, len(t), len(t)] for s, t in prompts.items()]
    # and the trace's step slices say it in their args
    trace = json.loads(llamacpp_instr.to_perfetto(log, tmp_path / "t.json", fmt="json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    steps = [e for e in events if e.get("cat") == "step" and e.get("ph") in ("X", "B")]
    assert [e["args"]["seqs"] for e in steps] == [
        " ".join(f"{s}:{len(t)}@0..{len(t) - 1}" for s, t in prompts.items()),
        " ".join(f"{s}:1@{len(t)}..{len(t)}" for s, t in prompts.items()),
    ]


def test_one_sequence_other_than_zero(instr_api: Any, tiny_llama_f32: Path, tmp_path: Path) -> None:
    log = tmp_path / "seq3.log"
    ll = LowLevel(tiny_llama_f32, n_seq_max=4)
    try:
        with llamacpp_instr.session(None, log):
            ll.decode({3: [(1, 0), (5, 1), (6, 2)]})
    finally:
        ll.close()
    (step,) = steps_of(records(log))
    assert step["seqs"] == [[3, 3, 0, 2]]


def test_single_sequence_zero_has_no_seqs_field(smollm2_detailed: Any) -> None:
    assert all("seqs" not in r for r in smollm2_detailed.of("step_begin"))


def test_set_request_needs_a_session(instr_api: Any, tiny_llama_f32: Path) -> None:
    llm = llama(tiny_llama_f32)
    try:
        with pytest.raises(bindings.SessionError) as e:
            instr_api.set_request(llm.ctx, "r1")
        assert e.value.code == bindings.ERR_NO_SESSION
    finally:
        llm.close()
