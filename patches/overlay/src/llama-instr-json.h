#pragma once

// llamacpp-instr: a minimal JSON writer appending to a reused std::string (no allocation once
// the string has grown to its working size). Output is always valid UTF-8.

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

struct ggml_tensor;

namespace llama_instr {

// a finite float as JSON text that reads back as the same float (nine significant digits,
// trailing zeros dropped; at most 16 characters); returns the end of the text
char * put_f32(char * p, float f);

struct json_out {
    std::string & s;

    void raw(const char * v) { s += v; }

    void raw(const std::string & v) { s += v; }

    void ch(char c) { s.push_back(c); }

    void i64(int64_t v);
    void f64(double v);  // NaN and infinities become null
    // a value of float data (a float, or a double computed from floats): put_f32's text of the
    // float, which reads back as the same float; outside a float's range, as f64
    void f32(double v);

    // the values, comma-separated (a row's elements, inside the caller's brackets)
    void i64s(std::initializer_list<int64_t> vs);

    void boolean(bool v) { s += v ? "true" : "false"; }

    void null() { s += "null"; }

    // A JSON string. Bytes that are not well-formed UTF-8 (token pieces can be partial
    // characters) become U+FFFD, so the line always decodes.
    void str(const char * v, size_t len);
    void str(const char * v);

    void str(const std::string & v) { str(v.data(), v.size()); }

    // a comma unless right after an opening bracket
    void sep();
    // "key": (with a comma first when needed)
    void key(const char * k);
    // [ne0, ne1, ...] up to the tensor's last non-1 dimension (at least one)
    void shape(const int64_t * ne, int n_dims);
    void shape(const ggml_tensor * t);
};

// Rows of numbers formatted into a local buffer and appended to the line a few kilobytes at a
// time: a step writes a row per op (605 for SmolLM2), and appending each bracket, comma and
// number to the line took about a third of formatting them. What it holds is appended by
// flush(), which the caller calls after its last row (appending may throw std::bad_alloc, so a
// destructor never does it: what is left unflushed when an exception unwinds the rows is dropped
// with the record); nothing else may write to the line meanwhile.
class json_rows {
  public:
    explicit json_rows(json_out & j) : j(j) {}

    ~json_rows() = default;

    json_rows(const json_rows &)             = delete;
    json_rows & operator=(const json_rows &) = delete;

    void ch(char c) {
        room();
        *p++ = c;
    }

    // a row's opening bracket, after a comma unless it is the first row
    void row() {
        room();
        if (n_rows++ > 0) {
            *p++ = ',';
        }
        *p++ = '[';
    }

    void i64(int64_t v) {
        room();
        p = std::to_chars(p, end, v).ptr;
    }

    // as json_out::f32
    void f32(double v);

    void flush() {
        j.s.append(buf, p - buf);
        p = buf;
    }

  private:
    static constexpr ptrdiff_t ROOM = 48;  // a character, or a number's text (at most 24)

    void room() {
        if (end - p < ROOM) {
            flush();
        }
    }

    json_out &   j;
    char         buf[4096];
    char *       p      = buf;
    char * const end    = buf + sizeof(buf);
    size_t       n_rows = 0;
};

// Start a record: {"type":"<type>","ts":<ts>,"sid":"<sid>" (the caller adds fields and the '}').
void record_head(json_out & j, const char * type, int64_t ts, const std::string & sid);

// What json_object_check found in a caller's JSON.
enum class json_check {
    ok,
    invalid,   // not exactly one JSON object on one line, in UTF-8
    reserved,  // a valid object, with one of the reserved keys at its top level
};

// Is s exactly one JSON object (RFC 8259; spaces and tabs around tokens, no line breaks, at most
// 64 levels deep, no lone surrogate escapes), in well-formed UTF-8? Its top-level keys are
// compared with `reserved` (n_reserved of them) after decoding their escapes. Never allocates.
json_check json_object_check(const char * s, const char * const * reserved, size_t n_reserved) noexcept;

// Length of the well-formed UTF-8 sequence at p (1..4), or 0 if p[0..] does not start one:
// Unicode's table 3-7, which excludes overlong forms, surrogates and code points above U+10FFFF.
size_t utf8_sequence_len(const unsigned char * p, size_t avail);

}  // namespace llama_instr
