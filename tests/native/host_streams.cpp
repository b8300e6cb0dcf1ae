// llama-server's stream chunks on one HTTP thread: each call of a stream's content provider is a
// send_scope, and the request its stream's next() named is forgotten when the call returns,
// written or not (a stream's last call writes nothing), so that the thread's next stream, whose
// chunks may name no request (a replayed conversation), adds its sends to none, and nothing on
// the thread holds a request after its stream. tests/test_native_units.py builds it against the
// patched tree.
#include "check.h"
#include "llama-instr-tools.h"

#include <cstdio>
#include <memory>
#include <mutex>

// the sends counted for `t`'s request
static int64_t sends_of(const llama_instr_tools::request_tracker & t) {
    std::lock_guard<std::mutex> lock(llama_instr_tools::requests_mutex());
    return t->r->host ? t->r->host->sends : 0;
}

// two content provider calls of one stream, the last writing nothing (as the server's
// chunked_content_provider makes them), then a call of a stream whose next() names no request
static void streams_on_one_thread() {
    auto a = llama_instr_tools::request_begin("/completion", {});
    CHECK(a != nullptr);
    llama_instr_tools::request_task(a, 1000000);
    std::weak_ptr<llama_instr_tools::request_state> a_state = a->r;
    {
        const llama_instr_tools::send_scope call;
        llama_instr_tools::host_sending(a);  // its next() made a chunk: written
        llama_instr_tools::host_sent(llama_instr_tools::host_clock());
    }
    {
        const llama_instr_tools::send_scope call;
        llama_instr_tools::host_sending(a);  // its last next(): no chunk, nothing written
    }
    CHECK(sends_of(a) == 1);
    {
        const llama_instr_tools::send_scope call;  // a replayed conversation's chunk
        llama_instr_tools::host_sent(llama_instr_tools::host_clock());
    }
    CHECK(sends_of(a) == 1);
    llama_instr_tools::request_end(a, 200, "ok");
    a.reset();
    CHECK(a_state.expired());  // nothing on the thread holds the request after its stream
}

int main(int argc, char ** argv) {
    CHECK(argc == 2);
    CHECK(llama_instr_session_begin(nullptr, argv[1], LLAMA_INSTR_LEVEL_MINIMAL, nullptr) == LLAMA_INSTR_OK);
    streams_on_one_thread();
    CHECK(llama_instr_session_end("ok") == LLAMA_INSTR_OK);
    printf("each chunk counted once, for its own request\n");
    return 0;
}
