#include "llama-instr-json.h"

#include "ggml.h"

#include <algorithm>
#include <cfloat>
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

void json_out::i64s(std::initializer_list<int64_t> vs) {
    // formatted into one buffer and appended once, not a comma and a number at a time: a step
    // writes a row of these per op
    constexpr ptrdiff_t ROOM = 21;  // a comma and an int64 (at most 20 characters)
    char                buf[8 * ROOM];
    char *              p     = buf;
    bool                first = true;
    for (int64_t v : vs) {
        if (buf + sizeof(buf) - p < ROOM) {
            s.append(buf, p - buf);
            p = buf;
        }
        if (!first) {
            *p++ = ',';
        }
        first = false;
        p     = std::to_chars(p, buf + sizeof(buf), v).ptr;
    }
    s.append(buf, p - buf);
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

// Powers of ten from 1e-60 to 1e60 as doubles: computed, so the far ends are a few ulps off,
// which moves no ninth digit by more than one
struct pow10_table {
    double v[121];

    constexpr pow10_table() : v() {
        double x = 1.0;
        for (int i = 0; i <= 60; i++) {
            v[60 + i] = x;
            v[60 - i] = 1.0 / x;
            x *= 10.0;
        }
    }
};

static constexpr pow10_table TEN{};

static const char DIGIT_PAIRS[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

// A finite float's nine significant digits, trailing zeros dropped: every float reads back as
// itself from nine (its spacing is at least 6e-8 of it, and a ninth digit off by one moves the
// text by at most 1e-8 of it), in about a third of the time of the shortest text (to_chars).
// Fixed notation for exponents -5 to 8, d.ddde-x otherwise; at most 16 characters.
char * put_f32(char * p, float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof(bits));
    if (bits >> 31) {
        *p++ = '-';
    }
    bits &= 0x7fffffffu;
    if (bits == 0) {
        *p++ = '0';
        return p;
    }
    const double v   = std::fabs((double) f);
    // floor(e2 * log10(2)): the value lies in [10^e10, 10^(e10 + 2)); a subnormal starts lower
    const int    e2  = (bits >> 23) ? (int) (bits >> 23) - 127 : -150;
    int          e10 = (e2 * 78913) >> 18;
    uint64_t     m   = (uint64_t) (v * TEN.v[60 + 8 - e10] + 0.5);
    while (m >= 1000000000u) {
        e10++;
        m = (uint64_t) (v * TEN.v[60 + 8 - e10] + 0.5);
    }
    char     d[9];
    uint32_t r = (uint32_t) m;
    d[0]       = (char) ('0' + r / 100000000u);
    r %= 100000000u;
    memcpy(d + 1, DIGIT_PAIRS + 2 * (r / 1000000u), 2);
    r %= 1000000u;
    memcpy(d + 3, DIGIT_PAIRS + 2 * (r / 10000u), 2);
    r %= 10000u;
    memcpy(d + 5, DIGIT_PAIRS + 2 * (r / 100u), 2);
    memcpy(d + 7, DIGIT_PAIRS + 2 * (r % 100u), 2);
    int nd = 9;
    while (nd > 1 && d[nd - 1] == '0') {
        nd--;
    }
    if (e10 >= -5 && e10 < 0) {
        *p++ = '0';
        *p++ = '.';
        for (int i = -1; i > e10; i--) {
            *p++ = '0';
        }
        memcpy(p, d, nd);
        return p + nd;
    }
    if (e10 >= 0 && e10 < 9) {
        const int ip = e10 + 1;
        for (int i = 0; i < ip; i++) {
            *p++ = i < nd ? d[i] : '0';
        }
        if (nd > ip) {
            *p++ = '.';
            memcpy(p, d + ip, nd - ip);
            p += nd - ip;
        }
        return p;
    }
    *p++ = d[0];
    if (nd > 1) {
        *p++ = '.';
        memcpy(p, d + 1, nd - 1);
        p += nd - 1;
    }
    *p++ = 'e';
    if (e10 < 0) {
        *p++ = '-';
        e10  = -e10;
    }
    if (e10 >= 10) {
        memcpy(p, DIGIT_PAIRS + 2 * e10, 2);
        return p + 2;
    }
    *p++ = (char) ('0' + e10);
    return p;
}

void json_out::f32(double v) {
    if (std::isfinite(v) && std::fabs(v) <= (double) FLT_MAX) {
        char buf[24];
        s.append(buf, put_f32(buf, (float) v) - buf);
        return;
    }
    f64(v);
}

void json_rows::f32(double v) {
    if (std::isfinite(v) && std::fabs(v) <= (double) FLT_MAX) {
        room();
        p = put_f32(p, (float) v);
        return;
    }
    flush();
    j.f32(v);
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

namespace {

// A recursive-descent checker of one JSON text; p advances over what it accepted.
struct json_checker {
    const unsigned char * p;
    const unsigned char * end;
    int                   depth = 0;

    static constexpr int MAX_DEPTH = 64;

    void ws() {
        while (p < end && (*p == ' ' || *p == '\t')) {
            p++;
        }
    }

    bool eat(char c) {
        if (p < end && *p == (unsigned char) c) {
            p++;
            return true;
        }
        return false;
    }

    bool literal(const char * w) {
        const size_t n = strlen(w);
        if ((size_t) (end - p) < n || memcmp(p, w, n) != 0) {
            return false;
        }
        p += n;
        return true;
    }

    bool hex4(uint32_t & v) {
        if (end - p < 4) {
            return false;
        }
        v = 0;
        for (int i = 0; i < 4; i++) {
            const unsigned char c = p[i];
            const int           d = c >= '0' && c <= '9' ? c - '0' :
                                    c >= 'a' && c <= 'f' ? c - 'a' + 10 :
                                    c >= 'A' && c <= 'F' ? c - 'A' + 10 :
                                                           -1;
            if (d < 0) {
                return false;
            }
            v = v * 16 + (uint32_t) d;
        }
        p += 4;
        return true;
    }

    // Code point cp in UTF-8, into b: its length.
    static size_t utf8_encode(uint32_t cp, char (&b)[4]) {
        if (cp < 0x80) {
            b[0] = (char) cp;
            return 1;
        }
        if (cp < 0x800) {
            b[0] = (char) (0xC0 | (cp >> 6));
            b[1] = (char) (0x80 | (cp & 0x3F));
            return 2;
        }
        if (cp < 0x10000) {
            b[0] = (char) (0xE0 | (cp >> 12));
            b[1] = (char) (0x80 | ((cp >> 6) & 0x3F));
            b[2] = (char) (0x80 | (cp & 0x3F));
            return 3;
        }
        b[0] = (char) (0xF0 | (cp >> 18));
        b[1] = (char) (0x80 | ((cp >> 12) & 0x3F));
        b[2] = (char) (0x80 | ((cp >> 6) & 0x3F));
        b[3] = (char) (0x80 | (cp & 0x3F));
        return 4;
    }

    // A \u escape (p after its u): its code point, a surrogate pair's whole. False if it is none.
    bool unicode_escape(uint32_t & cp) {
        if (!hex4(cp)) {
            return false;
        }
        if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return false;  // a lone low surrogate
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t lo;
            if (!literal("\\u") || !hex4(lo) || lo < 0xDC00 || lo > 0xDFFF) {
                return false;  // a high surrogate not followed by a low one
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        return true;
    }

    // An escape (p after its backslash): its decoded bytes into b, and their count k. False if it
    // is none.
    bool escape(char (&b)[4], size_t & k) {
        if (p >= end) {
            return false;
        }
        const unsigned char e = *p++;
        switch (e) {
            case '"':
            case '\\':
            case '/':
                b[0] = (char) e;
                k    = 1;
                return true;
            case 'b':
            case 'f':
            case 'n':
            case 'r':
            case 't':
                b[0] = e == 'b' ? '\b' : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r' : '\t';
                k    = 1;
                return true;
            case 'u':
                {
                    uint32_t cp;
                    if (!unicode_escape(cp)) {
                        return false;
                    }
                    k = utf8_encode(cp, b);
                    return true;
                }
            default:
                return false;
        }
    }

    // A string (p at its opening quote). Its decoded bytes go to out[0..cap) and their count to
    // n (beyond cap only counted) when out is given.
    bool string(char * out, size_t cap, size_t & n) {
        n        = 0;
        auto put = [&](const char * b, size_t k) {
            for (size_t i = 0; i < k; i++, n++) {
                if (out && n < cap) {
                    out[n] = b[i];
                }
            }
        };
        if (!eat('"')) {
            return false;
        }
        while (p < end) {
            const unsigned char c = *p;
            if (c == '"') {
                p++;
                return true;
            }
            if (c < 0x20) {
                return false;  // control characters must be escaped
            }
            if (c >= 0x80) {
                const size_t k = utf8_sequence_len(p, (size_t) (end - p));
                if (k == 0) {
                    return false;
                }
                put((const char *) p, k);
                p += k;
                continue;
            }
            if (c != '\\') {
                put((const char *) p, 1);
                p++;
                continue;
            }
            p++;
            char   b[4];
            size_t k;
            if (!escape(b, k)) {
                return false;
            }
            put(b, k);
        }
        return false;  // unterminated
    }

    bool digits() {
        const unsigned char * s = p;
        while (p < end && *p >= '0' && *p <= '9') {
            p++;
        }
        return p > s;
    }

    // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?  (so no NaN, no Infinity)
    bool number() {
        eat('-');
        if (eat('0')) {
            // no leading zeros
        } else if (p < end && *p >= '1' && *p <= '9') {
            digits();
        } else {
            return false;
        }
        if (eat('.') && !digits()) {
            return false;
        }
        if (eat('e') || eat('E')) {
            if (!eat('+')) {
                eat('-');
            }
            if (!digits()) {
                return false;
            }
        }
        return true;
    }

    bool value() {
        if (p >= end) {
            return false;
        }
        size_t n;
        switch (*p) {
            case '{':
                return object(nullptr, 0, nullptr);
            case '[':
                return array();
            case '"':
                return string(nullptr, 0, n);
            case 't':
                return literal("true");
            case 'f':
                return literal("false");
            case 'n':
                return literal("null");
            default:
                return number();
        }
    }

    bool array() {
        if (++depth > MAX_DEPTH || !eat('[')) {
            return false;
        }
        ws();
        if (!eat(']')) {
            do {
                ws();
                if (!value()) {
                    return false;
                }
                ws();
            } while (eat(','));
            if (!eat(']')) {
                return false;
            }
        }
        depth--;
        return true;
    }

    // An object; when `reserved` is given, found is set if one of its keys is reserved.
    bool object(const char * const * reserved, size_t n_reserved, bool * found) {
        if (++depth > MAX_DEPTH || !eat('{')) {
            return false;
        }
        ws();
        if (!eat('}')) {
            do {
                ws();
                char   key[16];
                size_t n;
                if (!string(key, sizeof(key), n)) {
                    return false;
                }
                for (size_t i = 0; found && i < n_reserved; i++) {
                    if (n == strlen(reserved[i]) && n <= sizeof(key) && memcmp(key, reserved[i], n) == 0) {
                        *found = true;
                    }
                }
                ws();
                if (!eat(':')) {
                    return false;
                }
                ws();
                if (!value()) {
                    return false;
                }
                ws();
            } while (eat(','));
            if (!eat('}')) {
                return false;
            }
        }
        depth--;
        return true;
    }
};

}  // namespace

json_check json_object_check(const char * s, const char * const * reserved, size_t n_reserved) noexcept {
    json_checker c{ (const unsigned char *) s, (const unsigned char *) s + strlen(s) };
    bool         found = false;
    c.ws();
    if (!c.object(reserved, n_reserved, &found)) {
        return json_check::invalid;
    }
    c.ws();
    if (c.p != c.end) {
        return json_check::invalid;
    }
    return found ? json_check::reserved : json_check::ok;
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
