// llama-server's hold on a request going away while allocations fail (a stream the client
// dropped, out of memory): the last copy of the request_tracker is released with every allocation
// from the n-th on failing, for n = 1, 2, ... until one runs through. ~request_handle builds and
// writes the request's record; nothing may leave it (a destructor that throws ends the server with
// std::terminate). Each failure loses the record, counted in the session's lost records; the run
// that allocates freely writes it. tests/test_native_units.py builds it against the patched tree.
#include "check.h"
#include "fail_from.h"
#include "llama-instr-tools.h"

#include <cstdio>
#include <fstream>
#include <string>

// a chunk of the stream (server_task_result_cmpl_partial): the tokens decoded so far, of the
// request's task of this index
struct partial_result {
    int    n_decoded;
    size_t index = 0;
};

// the records of type "request" in the log, and the session's lost count (session_end), or -1
static void read_log(const char * path, int & n_requests, long & lost) {
    std::ifstream in(path);
    std::string   line;
    n_requests = 0;
    lost       = -1;
    while (std::getline(in, line)) {
        if (line.find("\"type\":\"request\"") != std::string::npos) {
            n_requests++;
        }
        const size_t at = line.find("\"lost\":");
        if (line.find("\"type\":\"session_end\"") != std::string::npos) {
            lost = at == std::string::npos ? 0 : std::stol(line.substr(at + 7));
        }
    }
}

int main(int argc, char ** argv) {
    CHECK(argc == 2);
    const char * log = argv[1];
    CHECK(llama_instr_session_begin(nullptr, log, LLAMA_INSTR_LEVEL_MINIMAL, nullptr) == LLAMA_INSTR_OK);
    long from = 1;
    for (;; from++) {
        auto t = llama_instr_tools::request_begin("/v1/chat/completions", {});
        CHECK(t != nullptr);
        llama_instr_tools::request_task(t, (int) from);
        const partial_result chunk = { 2 };
        llama_instr_tools::request_sent(t, &chunk);  // a stream, two tokens sent
        fail_allocations_from(from);
        t.reset();                                   // the client went away: the request's last hold is released here
        const long seen = g_seen;
        fail_allocations_from(0);
        if (seen < from) {
            break;  // nothing failed: the record was written
        }
    }
    CHECK(llama_instr_session_end("ok") != LLAMA_INSTR_ERR_NO_SESSION);
    int  n_requests = 0;
    long lost       = 0;
    read_log(log, n_requests, lost);
    // the last run wrote its record; every run before it lost at most its one record
    CHECK(n_requests >= 1);
    CHECK(lost >= 1 && lost + n_requests <= from);
    printf("%ld allocations failed in turn, each survived; %d records written, %ld lost\n", from - 1, n_requests, lost);
    return 0;
}
