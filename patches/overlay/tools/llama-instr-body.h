#pragma once

// llamacpp-instr: a llama-server request's body as its `request` record keeps it, so that `instr
// replay` can send it again (docs/schema.md): at DETAILED and above, unless LLAMA_INSTR_BODIES=0.
// Every medium in it (a chat part's `data:` URL or `input_audio.data`, a prompt's
// `multimodal_data`) is kept as its hash and size, never its bytes:
// {"instr_media":{"hash":"<16 hex>","bytes":N,"prefix":"data:image/png;base64,"}}. A body whose
// recorded form is over BODY_MAX, or that is not a JSON object, is left out and said so.
// Included by llama-server's server-context.cpp only (nlohmann's JSON, as the server has it).

#include "llama-instr-tools.h"

#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace llama_instr_tools {

constexpr size_t BODY_MAX       = 1 << 20;   // the recorded form
constexpr size_t BODY_PARSE_MAX = 64 << 20;  // a body larger is not parsed again for its record
constexpr int    BODY_MAX_DEPTH = 64;        // no medium is looked for deeper
using body_json                 = nlohmann::ordered_json;

// The bytes of base64 text from `from`, up to its first byte that is not of the alphabet.
inline std::vector<unsigned char> base64_bytes(const std::string & s, size_t from) {
    std::vector<unsigned char> out;
    out.reserve((s.size() - std::min(from, s.size())) / 4 * 3);
    uint32_t acc = 0;
    int      n   = 0;
    for (size_t i = from; i < s.size(); i++) {
        const unsigned char c = (unsigned char) s[i];
        int                 v;
        if (c >= 'A' && c <= 'Z') {
            v = c - 'A';
        } else if (c >= 'a' && c <= 'z') {
            v = c - 'a' + 26;
        } else if (c >= '0' && c <= '9') {
            v = c - '0' + 52;
        } else if (c == '+' || c == '-') {
            v = 62;
        } else if (c == '/' || c == '_') {
            v = 63;
        } else {
            break;
        }
        acc = (acc << 6) | (uint32_t) v;
        if (++n == 4) {
            out.push_back((unsigned char) (acc >> 16));
            out.push_back((unsigned char) (acc >> 8));
            out.push_back((unsigned char) acc);
            acc = 0;
            n   = 0;
        }
    }
    if (n == 3) {
        out.push_back((unsigned char) (acc >> 10));
        out.push_back((unsigned char) (acc >> 2));
    } else if (n == 2) {
        out.push_back((unsigned char) (acc >> 4));
    }
    return out;
}

// The marker that stands for the medium `v` (base64 after its first `prefix_len` bytes).
inline body_json media_marker(const std::string & v, size_t prefix_len) {
    const std::vector<unsigned char> bytes = base64_bytes(v, prefix_len);
    char                             hex[20];
    snprintf(hex, sizeof(hex), "%016" PRIx64, llama_instr_hash_bytes(bytes.data(), bytes.size()));
    body_json m;
    m["hash"]   = hex;
    m["bytes"]  = bytes.size();
    m["prefix"] = v.substr(0, prefix_len);
    body_json w;
    w["instr_media"] = std::move(m);
    return w;
}

// Each medium of `v` replaced by its marker, to BODY_MAX_DEPTH levels.
inline void replace_media(body_json & v, int depth) {
    if (depth > BODY_MAX_DEPTH) {
        return;
    }
    if (v.is_array()) {
        for (auto & e : v) {
            replace_media(e, depth + 1);
        }
        return;
    }
    if (!v.is_object()) {
        return;
    }
    for (auto it = v.begin(); it != v.end(); ++it) {
        body_json & e = it.value();
        if (it.key() == "url" && e.is_string()) {
            const std::string & s = e.get_ref<const std::string &>();
            const size_t        b = s.rfind(";base64,", 256);
            if (s.compare(0, 5, "data:") == 0 && b != std::string::npos) {
                e = media_marker(s, b + 8);
            }
        } else if (it.key() == "input_audio" && e.is_object() && e.contains("data") && e["data"].is_string()) {
            e["data"] = media_marker(e["data"].get_ref<const std::string &>(), 0);
        } else if (it.key() == "multimodal_data" && e.is_array()) {
            for (auto & d : e) {
                if (d.is_string()) {
                    d = media_marker(d.get_ref<const std::string &>(), 0);
                }
            }
        } else {
            replace_media(e, depth + 1);
        }
    }
}

// The recorded form of the body `raw` into `kept`: nullptr, or why it is left out ("size",
// "not_json"; `kept` then empty). Never throws: out of memory on a large body leaves it out.
inline const char * body_record(const std::string & raw, std::string & kept) noexcept {
    kept.clear();
    try {
        if (raw.size() > BODY_PARSE_MAX) {
            return "size";
        }
        body_json v = body_json::parse(raw, nullptr, false);
        if (v.is_discarded() || !v.is_object()) {
            return "not_json";
        }
        replace_media(v, 0);
        kept = v.dump(-1, ' ', false, body_json::error_handler_t::replace);
        if (kept.size() > BODY_MAX) {
            kept.clear();
            return "size";
        }
        return nullptr;
    } catch (...) {
        kept.clear();
        return "size";
    }
}

// The request's body `raw`, as it arrived: kept in its record for a replay (see above). Never
// throws: what fails leaves the body out.
inline void request_body(const request_tracker & t, const std::string & raw) noexcept {
    if (!t || llama_instr_get_level() < LLAMA_INSTR_LEVEL_DETAILED) {
        return;
    }
    const char * env = getenv("LLAMA_INSTR_BODIES");
    if (env && strcmp(env, "0") == 0) {
        return;
    }
    std::string        kept;
    const char * const left_out = body_record(raw, kept);
    try {
        std::lock_guard<std::mutex> lock(requests_mutex());
        request_state &             r = *t->r;
        r.body.swap(kept);
        r.body_left_out = left_out;
        r.body_bytes    = (int64_t) raw.size();
        r.keep_ids      = true;
    } catch (...) {
        // the lock failed: the record has no body
    }
}

}  // namespace llama_instr_tools
