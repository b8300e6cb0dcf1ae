// llama-server's hooks of the host's work, called while allocations fail: host_sent inside
// cpp-httplib's content provider (an exception out of it reaches no catch: the server ends) and
// host_released on the server's thread. Each is noexcept (as are host_request and host_sending);
// each runs with every allocation from the n-th on failing, for n = 1, 2, ... until one runs
// through, lets nothing out, and what a failure loses is counted in the session's lost records.
// tests/test_native_units.py builds it against the patched tree.
#include "check.h"
#include "fail_from.h"
#include "llama-instr-tools.h"

#include <cstdio>
#include <fstream>
#include <string>

// the session's lost records (session_end), or -1
static long lost_in(const char * path) {
    std::ifstream in(path);
    std::string   line;
    long          lost = -1;
    while (std::getline(in, line)) {
        const size_t at = line.find("\"lost\":");
        if (line.find("\"type\":\"session_end\"") != std::string::npos) {
            lost = at == std::string::npos ? 0 : std::stol(line.substr(at + 7));
        }
    }
    return lost;
}

int main(int argc, char ** argv) {
    CHECK(argc == 2);
    const char * log = argv[1];
    CHECK(llama_instr_session_begin(nullptr, log, LLAMA_INSTR_LEVEL_MINIMAL, nullptr) == LLAMA_INSTR_OK);
    long failed = 0;  // calls that ran into a failed allocation
    long runs   = 0;
    int  task   = 1;
    for (int hook = 0; hook < 2; hook++) {
        for (long from = 1;; from++, task++) {
            auto t = llama_instr_tools::request_begin("/completion", {});
            CHECK(t != nullptr);
            llama_instr_tools::request_task(t, task);
            bool threw = false;
            fail_allocations_from(from);
            try {
                if (hook == 0) {
                    llama_instr_tools::host_sending(t);  // the stream's next() names its request
                    llama_instr_tools::host_sent(llama_instr_tools::host_clock());
                } else {
                    llama_instr_tools::host_released(task, 1);
                }
            } catch (...) {
                threw = true;
            }
            const long seen = g_seen;
            fail_allocations_from(0);
            CHECK(!threw);
            llama_instr_tools::request_end(t, 200, "ok");
            runs++;
            if (seen < from) {
                break;  // nothing failed: the hook ran through
            }
            failed++;
        }
    }
    // and none can let one out (a compile-time fact, checked here so that a hook that is not
    // noexcept fails the unit rather than its build)
    CHECK(noexcept(llama_instr_tools::host_sent(0)));
    CHECK(noexcept(llama_instr_tools::host_released(0, 0)));
    CHECK(noexcept(llama_instr_tools::host_request(nullptr, 0, 0)));
    CHECK(noexcept(llama_instr_tools::host_sending(nullptr)));
    CHECK(llama_instr_session_end("ok") != LLAMA_INSTR_ERR_NO_SESSION);
    const long lost = lost_in(log);
    // each call that failed lost what it recorded, and said so
    CHECK(failed >= 2);
    CHECK(lost == failed);
    printf("%ld calls failed an allocation, each survived; %ld lost of %ld runs\n", failed, lost, runs);
    return 0;
}
