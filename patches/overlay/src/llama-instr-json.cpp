#include "llama-instr-json.h"

#include "ggml.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace llama_instr {

void json_out::i64(int64_t v) {
    char       buf[24];
    const auto r = std::to_chars(buf, buf + sizeof(buf), v);  // no locale, no format parsing
    s.append(buf, r.ptr - buf);
}

void json_out::f64(double v) {
    if (!std::isfinite(v)) {
        null();
        return;
    }
    char buf[40];
#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L
    // 9 significant digits (a float round-trips), without snprintf's locale and format parsing
    const auto r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::general, 9);
    s.append(buf, r.ptr - buf);
#else
    const int n = snprintf(buf, sizeof(buf), "%.9g", v);
    s.append(buf, n);
#endif
}

// The lead byte's sequence length and the allowed range of the second byte; 0 if not a lead.
static size_t utf8_lead(unsigned char c, unsigned char & lo, unsigned char & hi) {
    lo = 0x80;
    hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        return 2;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        lo = c == 0xE0 ? 0xA0 : 0x80;  // E0 80..9F would be overlong
        hi = c == 0xED ? 0x9F : 0xBF;  // ED A0..BF would be a surrogate
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        lo = c == 0xF0 ? 0x90 : 0x80;  // F0 80..8F would be overlong
        hi = c == 0xF4 ? 0x8F : 0xBF;  // F4 90.. would be above U+10FFFF
        return 4;
    }
    return 0;  // continuation byte, C0/C1 (overlong) or F5..FF
}

// How many bytes at p form the start of a well-formed sequence (all of it when complete)
static size_t utf8_valid_prefix(const unsigned char * p, size_t avail, size_t & n) {
    unsigned char lo, hi;
    n = utf8_lead(p[0], lo, hi);
    if (n == 0) {
        return 0;
    }
    size_t k = 1;
    while (k < n && k < avail && p[k] >= (k == 1 ? lo : 0x80) && p[k] <= (k == 1 ? hi : 0xBF)) {
        k++;
    }
    return k;
}

size_t utf8_sequence_len(const unsigned char * p, size_t avail) {
    if (p[0] < 0x80) {
        return 1;
    }
    size_t       n = 0;
    const size_t k = utf8_valid_prefix(p, avail, n);
    return n > 0 && k == n ? n : 0;
}

void json_out::str(const char * v, size_t len) {
    s.push_back('"');
    const auto * p   = (const unsigned char *) v;
    const auto * end = p + len;
    while (p < end) {
        const unsigned char c = *p;
        if (c >= 0x80) {
            size_t       n = 0;
            const size_t k = utf8_valid_prefix(p, (size_t) (end - p), n);
            if (n > 0 && k == n) {
                s.append((const char *) p, n);
                p += n;
            } else {
                // one U+FFFD per maximal ill-formed subpart (Unicode's recommended practice,
                // the one Python's decoder follows)
                s += "\xEF\xBF\xBD";
                p += k > 0 ? k : 1;
            }
            continue;
        }
        switch (c) {
            case '"':
                s += "\\\"";
                break;
            case '\\':
                s += "\\\\";
                break;
            case '\n':
                s += "\\n";
                break;
            case '\r':
                s += "\\r";
                break;
            case '\t':
                s += "\\t";
                break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    snprintf(buf, sizeof(buf), "\\u%04x", c);
                    s += buf;
                } else {
                    s.push_back((char) c);
                }
        }
        p++;
    }
    s.push_back('"');
}

void json_out::str(const char * v) {
    str(v, strlen(v));
}

void json_out::sep() {
    if (!s.empty() && s.back() != '{' && s.back() != '[') {
        s.push_back(',');
    }
}

void json_out::key(const char * k) {
    sep();
    s.push_back('"');
    s += k;
    s += "\":";
}

void json_out::shape(const int64_t * ne, int n_dims) {
    const int nd = std::max(1, n_dims);
    ch('[');
    for (int d = 0; d < nd; d++) {
        if (d) {
            ch(',');
        }
        i64(ne[d]);
    }
    ch(']');
}

void json_out::shape(const ggml_tensor * t) {
    shape(t->ne, ggml_n_dims(t));
}

void record_head(json_out & j, const char * type, int64_t ts, const std::string & sid) {
    j.s.clear();
    j.raw("{\"type\":\"");
    j.raw(type);
    j.raw("\",\"ts\":");
    j.i64(ts);
    j.raw(",\"sid\":\"");
    j.raw(sid);  // hex digits
    j.ch('"');
}

}  // namespace llama_instr
