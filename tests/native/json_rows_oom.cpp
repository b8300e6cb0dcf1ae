// The writer out of memory mid-record (issue 55 §1): rows formatted with json_rows into a new line
// (so that every append may allocate), every allocation from the n-th on failing, for n = 1, 2, ...
// until one runs through. Each must end in std::bad_alloc caught here, as a hook's catch drops its
// record, and never in std::terminate: an append from a destructor, while the first failure
// unwinds, throws the second. tests/test_native_units.py builds it against the patched tree.
#include "fail_from.h"
#include "llama-instr-json.cpp"

#include <cstdio>
#include <new>

// a compute record's op rows, as write_ops formats them
static void write_rows(std::string & line, int n_rows) {
    llama_instr::json_out j{ line };
    llama_instr::record_head(j, "compute", 1, "00112233");
    j.key("ops");
    j.ch('[');
    llama_instr::json_rows r{ j };
    for (int i = 0; i < n_rows; i++) {
        r.row();
        r.i64(i);
        r.ch(',');
        r.i64((int64_t) i * 1000);
        r.ch(',');
        r.i64(250);
        r.ch(']');
    }
    r.ch(']');
    r.flush();
    j.ch('}');
}

int main() {
    std::string want;
    write_rows(want, 1000);
    for (long from = 1;; from++) {
        std::string line;
        bool        failed = false;
        fail_allocations_from(from);
        try {
            write_rows(line, 1000);
        } catch (const std::bad_alloc &) {
            failed = true;
        }
        fail_allocations_from(0);
        if (!failed) {
            if (line != want) {
                fprintf(stderr, "the record written after %ld allocations differs\n", from - 1);
                return 1;
            }
            printf("%ld allocations failed in turn, each caught\n", from - 1);
            return 0;
        }
    }
}
