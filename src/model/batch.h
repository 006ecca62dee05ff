#pragma once
// One forward pass's worth of tokens: any mix of sequences, each contributing a contiguous run of
// positions (a prefill chunk or a single decode token).
#include <cstdint>
#include <vector>

namespace promptly {

struct Batch {
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> positions;
  std::vector<std::int32_t> seq_ids;
  std::vector<std::uint8_t> want_logits;  // 1 where the caller needs this token's logits

  void add(std::int32_t token, std::int32_t position, std::int32_t seq, bool logits) {
    tokens.push_back(token);
    positions.push_back(position);
    seq_ids.push_back(seq);
    want_logits.push_back(logits ? 1 : 0);
  }
  std::size_t size() const { return tokens.size(); }
  void clear() {
    tokens.clear();
    positions.clear();
    seq_ids.clear();
    want_logits.clear();
  }
};

}  // namespace promptly
