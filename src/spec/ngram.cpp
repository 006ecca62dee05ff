#include "spec/ngram.h"

#include <algorithm>
#include <string>

#include "util/error.h"

namespace promptly::spec {

NgramProposer::NgramProposer(std::size_t max_n) : max_n_(max_n) {
  if (max_n == 0 || max_n > 64) throw Error("--spec-ngram must be between 1 and 64 (got " + std::to_string(max_n) + ")");
}

void NgramProposer::propose(const std::vector<std::int32_t>& context, std::size_t max_tokens, Proposal& out) {
  out.clear();
  const std::size_t len = context.size();
  if (max_tokens == 0 || len < 2) return;
  // Longest suffix first: a longer match predicts better. The scan runs backwards so the latest
  // occurrence wins (recent text is the likeliest to repeat); at context sizes a CPU serves this is
  // microseconds against a forward pass's milliseconds.
  for (std::size_t n = std::min(max_n_, len - 1); n >= 1; --n) {
    const std::int32_t* suffix = context.data() + (len - n);
    for (std::size_t start = len - n; start-- > 0;) {
      if (context[start] != suffix[0] || !std::equal(suffix, suffix + n, context.data() + start)) continue;
      // Copy what followed, as LZ77 does: past the context's end the copy reads its own output, so a
      // run that repeats with a short period ("x = [0, 0, 0, ...") is proposed to full length.
      const std::size_t from = start + n;  // < len: the match ends before the suffix does
      for (std::size_t i = 0; i < max_tokens; ++i) {
        const std::size_t at = from + i;
        out.tokens.push_back(at < len ? context[at] : out.tokens[at - len]);
      }
      return;
    }
  }
}

}  // namespace promptly::spec
