// put_f32, the text VERBOSE writes each value statistic as: every float it is given reads back
// (strtof) as the same float, in at most 16 characters of a JSON number. Floats taken at a stride
// over every bit pattern, each sign, and a few on each side of every power of two (the exponent's
// estimate is exact or one low there), subnormals and FLT_MAX included. Prints "N floats".
// tests/test_native_units.py builds it against the patched tree.
#include "llama-instr-json.cpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>

// a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?(e-?[0-9]+)?
static bool json_number(const char * s) {
    if (*s == '-') {
        s++;
    }
    if (*s == '0') {
        s++;
    } else if (*s >= '1' && *s <= '9') {
        while (*s >= '0' && *s <= '9') {
            s++;
        }
    } else {
        return false;
    }
    if (*s == '.') {
        if (!(*++s >= '0' && *s <= '9')) {
            return false;
        }
        while (*s >= '0' && *s <= '9') {
            s++;
        }
    }
    if (*s == 'e') {
        if (*++s == '-') {
            s++;
        }
        if (!(*s >= '0' && *s <= '9')) {
            return false;
        }
        while (*s >= '0' && *s <= '9') {
            s++;
        }
    }
    return *s == '\0';
}

static long n_checked = 0;

static bool check(uint32_t bits) {
    float x;
    memcpy(&x, &bits, sizeof(x));
    char         buf[32];
    const char * end = llama_instr::put_f32(buf, x);
    buf[end - buf]   = '\0';
    const float y    = strtof(buf, nullptr);
    n_checked++;
    if (end - buf > 16 || !json_number(buf) || memcmp(&x, &y, sizeof(x)) != 0) {
        fprintf(stderr, "%a (bits %08x) written as \"%s\"\n", (double) x, bits, buf);
        return false;
    }
    return true;
}

int main() {
    for (uint64_t b = 0; b < 0x7f800000ull; b += 4099) {
        if (!check((uint32_t) b) || !check((uint32_t) b | 0x80000000u)) {
            return 1;
        }
    }
    for (uint32_t e = 0; e < 255; e++) {
        for (int d = -4; d <= 4; d++) {
            const int64_t b = ((int64_t) e << 23) + d;
            if (b >= 0 && b < 0x7f800000 && !check((uint32_t) b)) {
                return 1;
            }
        }
    }
    if (!check(0x7f7fffffu) || !check(1u) || !check(0x80000000u)) {
        return 1;
    }
    printf("%ld floats\n", n_checked);
    return 0;
}
