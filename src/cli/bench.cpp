// `promptly bench ...`: measurement programs that print a short table and, with --json, one JSON object.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "cli/commands.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/file_io.h"

namespace promptly::cli {
namespace {

// Mixed text standing in for real prompts: prose, code, numbers, whitespace runs, CJK and emoji.
std::string sample_text(std::size_t bytes) {
  static const char* const kParagraphs[] = {
      "Once upon a time, in a quiet village by the sea, there lived a curious girl named Lily. She loved asking questions "
      "about everything: why the sky was blue, how ships float, and what the stars were made of.\n\n",
      "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
      "for i in range(10):\n\tprint(f\"{i:>3}: {fibonacci(i)}\")\n",
      "The invoice totals 1,234.56 EUR (VAT 19%) — due 2024-07-26; ref #A-7781/B.   Call +49 30 1234567.\n",
      "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87\xe7\xab\xa0\xe3\x81\xa8\xe4\xb8\xad\xe6\x96\x87\xe5\x8f\xa5\xe5\xad\x90"
      "\xe3\x80\x82 \xf0\x9f\x98\x80\xf0\x9f\x9a\x80 \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82, \xd0\xbc\xd0\xb8\xd1\x80!\n",
  };
  std::string out;
  for (std::size_t i = 0; out.size() < bytes; ++i) out += kParagraphs[i % 4];
  return out;
}

}  // namespace

int bench_tokenize(const BenchTokenizeOptions& o) {
  const Tokenizer tok = Tokenizer::from_file(o.model);
  std::string text;
  if (!o.file.empty()) {
    text = read_file(o.file, "text file");
  } else {
    text = sample_text(1 << 20);
  }
  std::vector<double> encode_s, decode_s;
  std::size_t n_tokens = 0;
  bool round_trip = true;
  for (int r = 0; r < std::max(1, o.repetitions); ++r) {
    auto t0 = SteadyClock::now();
    const auto ids = tok.encode(text, false);
    encode_s.push_back(seconds_since(t0));
    n_tokens = ids.size();
    t0 = SteadyClock::now();
    const std::string back = tok.decode(ids);
    decode_s.push_back(seconds_since(t0));
    round_trip = round_trip && back == text;
  }
  std::sort(encode_s.begin(), encode_s.end());
  std::sort(decode_s.begin(), decode_s.end());
  const double enc = encode_s[encode_s.size() / 2], dec = decode_s[decode_s.size() / 2];
  const double mb = static_cast<double>(text.size()) / 1e6;
  nlohmann::json j = {{"model", o.model},          {"bytes", text.size()},          {"tokens", n_tokens},
                      {"encode_mb_s", mb / enc},   {"encode_tokens_s", n_tokens / enc}, {"decode_mb_s", mb / dec},
                      {"round_trip", round_trip},  {"repetitions", encode_s.size()}};
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("| tokenizer | bytes | tokens | encode MB/s | encode tokens/s | decode MB/s | round trip |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    std::printf("| %s | %zu | %zu | %.2f | %.0f | %.1f | %s |\n", o.model.c_str(), text.size(), n_tokens, mb / enc, n_tokens / enc,
                mb / dec, round_trip ? "exact" : "DIFFERS");
  }
  return 0;
}

}  // namespace promptly::cli
