// libFuzzer harness for what an HTTP client's bytes become in llama-server's `request` record
// (patches/overlay/tools/llama-instr-tools.h): the text of a prompt's tokens (utf8_text, which
// tokens_text applies to their pieces) and the `traceparent` header (valid_traceparent). Whatever
// the bytes, the record's field must be accepted by the checker llama_instr_write_record applies
// (json_object_check), or the record would be refused and the request lost; well-formed text must
// pass unchanged, and a traceparent only exactly as the W3C format allows. The first byte picks
// the target. tests/test_fuzz.py builds it against the patched tree and the build's libllama.
#include "llama-instr-json.h"
#include "llama-instr-tools.h"

#include <cstdio>
#include <cstdlib>
#include <string>

using namespace llama_instr_tools;

// {"f":<the value as the record writes it>} as write_record checks it
static bool accepted(const std::string & value) {
    const std::string obj = "{\"f\":" + json_str(value) + "}";
    return llama_instr::json_object_check(obj.c_str(), nullptr, 0) == llama_instr::json_check::ok;
}

static void fail(const char * what, const std::string & in, const std::string & out) {
    fprintf(stderr, "%s: %zu bytes in, %zu out\n", what, in.size(), out.size());
    abort();
}

static bool hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    if (size < 1) {
        return 0;
    }
    const uint8_t     target = data[0];
    const std::string in((const char *) data + 1, size - 1);
    if (target % 2 == 0) {
        const size_t      max = target < 128 ? 120 : in.size() + 4;
        const std::string out = utf8_text(in, max);
        if (!accepted(out)) {
            fail("utf8_text gave text the record's checker refuses", in, out);
        }
        if (out.size() > max + 3) {
            fail("utf8_text went past its bound", in, out);
        }
        // text that is well formed already (NUL aside: a C string ends there) passes whole
        if (max >= in.size() && in.find('\0') == std::string::npos && accepted(in) && out != in) {
            fail("utf8_text changed well-formed text", in, out);
        }
    } else {
        const std::string out = valid_traceparent(in);
        if (out.empty()) {
            return 0;
        }
        bool ok = out == in && out.size() == 55 && out.compare(0, 3, "00-") == 0 && out[35] == '-' && out[52] == '-';
        bool zero_trace = true, zero_span = true;
        for (size_t i = 3; ok && i < 55; i++) {
            if (i == 35 || i == 52) {
                continue;
            }
            ok         = hex(out[i]);
            zero_trace = zero_trace && (i > 35 || out[i] == '0');
            zero_span  = zero_span && (i < 36 || i > 51 || out[i] == '0');
        }
        if (!ok || zero_trace || zero_span || !accepted(out)) {
            fail("valid_traceparent let through what is no W3C traceparent", in, out);
        }
    }
    return 0;
}
