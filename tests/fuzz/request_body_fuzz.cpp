// libFuzzer harness for what an HTTP client's body becomes in llama-server's
// `request` record (patches/overlay/tools/llama-instr-body.h's body_record):
// the record embeds the recorded form as JSON, so whatever the bytes, that form
// must be one JSON object the record's checker accepts (json_object_check), or
// nothing with a reason; never over BODY_MAX. The first byte picks the target:
// the bytes as a whole body, or the bytes as an image's base64 in a chat body,
// where the image must come out as its marker (its size and hash, computed here
// from the bytes) and none of its base64 text may stay. tests/test_fuzz.py
// builds it against the patched tree and the build's libllama.
#include "llama-instr-body.h"
#include "llama-instr-json.h"

#include <cstdio>
#include <cstdlib>
#include <string>

using namespace llama_instr_tools;

static bool accepted(const std::string &kept) {
  const std::string obj = "{\"body\":" + kept + "}";
  return llama_instr::json_object_check(obj.c_str(), nullptr, 0) ==
         llama_instr::json_check::ok;
}

static void fail(const char *what, const std::string &in,
                 const std::string &out) {
  fprintf(stderr, "%s: %zu bytes in, %zu out\n", what, in.size(), out.size());
  abort();
}

static std::string base64(const std::string &in) {
  static const char *abc =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v =
        (uint8_t)in[i] << 16 | (uint8_t)in[i + 1] << 8 | (uint8_t)in[i + 2];
    out += abc[v >> 18];
    out += abc[(v >> 12) & 63];
    out += abc[(v >> 6) & 63];
    out += abc[v & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = (uint8_t)in[i] << 16;
    out += abc[v >> 18];
    out += abc[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint8_t)in[i] << 16 | (uint8_t)in[i + 1] << 8;
    out += abc[v >> 18];
    out += abc[(v >> 12) & 63];
    out += abc[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) {
    return 0;
  }
  const uint8_t target = data[0];
  const std::string in((const char *)data + 1, size - 1);
  std::string kept;
  if (target % 2 == 0) {
    const char *left_out = body_record(in, kept);
    if (left_out != nullptr
            ? !kept.empty()
            : (kept.empty() || kept[0] != '{' || !accepted(kept))) {
      fail("body_record kept what the record refuses", in, kept);
    }
    if (kept.size() > BODY_MAX) {
      fail("body_record went past its bound", in, kept);
    }
    return 0;
  }
  const std::string b64 = base64(in);
  const std::string body =
      "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
      "\"image_url\":"
      "{\"url\":\"data:image/png;base64," +
      b64 +
      "\"}},{\"type\":\"text\",\"text\":\"What is it?\"}]}],\"max_tokens\":4}";
  if (body_record(body, kept) != nullptr || !accepted(kept)) {
    fail("a chat body with an image was left out", in, kept);
  }
  char hash[20];
  snprintf(hash, sizeof(hash), "%016" PRIx64,
           llama_instr_hash_bytes(in.data(), in.size()));
  const std::string marker = "{\"instr_media\":{\"hash\":\"" +
                             std::string(hash) +
                             "\",\"bytes\":" + std::to_string(in.size()) +
                             ",\"prefix\":\"data:image/png;base64,\"}}";
  if (kept.find(marker) == std::string::npos) {
    fail("the image is not its marker", in, kept);
  }
  if (b64.size() >= 8 && kept.find(b64) != std::string::npos) {
    fail("the image's base64 stayed in the record", in, kept);
  }
  return 0;
}
