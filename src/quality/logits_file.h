#pragma once
// The reference's predictions on a text, stored once (--save-logits) so that candidates can be
// compared later without loading the reference (--kld-base): for a model too large to hold twice.
//
// Layout (little-endian):
//   "PRMPTLGT"  magic, 8 bytes
//   u32 version (1), u32 n_vocab, u32 ctx, u32 n_chunks, u32 first, u32 top_k
//   i32 tokens[n_chunks * ctx]          the chunks as evaluated (each begins with BOS)
//   per scored position, chunk by chunk (n_chunks * (ctx - 1 - first) of them):
//     f32 actual_logp, i32 ids[top_k], f32 logps[top_k]
//   u64 FNV-1a hash of every byte before it
// Top-k rather than the whole vocabulary: 64 entries hold all but a sliver of the probability mass
// of a trained model and keep the file ~n_vocab/128 times smaller than llama.cpp's 16-bit dumps.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "quality/perplexity.h"

namespace promptly::quality {

class LogitsFile {
 public:
  // Throws Error naming the file and what is wrong: not a logits file, another version, truncated,
  // sizes that disagree, a checksum mismatch.
  static LogitsFile load(const std::string& path);

  std::uint32_t n_vocab = 0, ctx = 0, n_chunks = 0, first = 0, top_k = 0;
  std::vector<std::int32_t> tokens;
  std::vector<float> actual_logps;
  std::vector<std::int32_t> ids;
  std::vector<float> logps;

  std::size_t n_records() const { return actual_logps.size(); }
  TopKRecord record(std::size_t i) const {
    return {actual_logps[i], ids.data() + i * top_k, logps.data() + i * top_k, top_k};
  }
};

// Streams records to `path + ".tmp"` and renames it into place on finish(), so a run that dies
// leaves no half file under the name.
class LogitsWriter {
 public:
  LogitsWriter(const std::string& path, std::uint32_t n_vocab, const ChunkPlan& plan, std::uint32_t top_k,
               const std::vector<std::int32_t>& chunk_tokens);
  ~LogitsWriter();
  LogitsWriter(const LogitsWriter&) = delete;
  LogitsWriter& operator=(const LogitsWriter&) = delete;

  void append(float actual_logp, const std::int32_t* ids, const float* logps);
  void finish();

 private:
  void put(const void* p, std::size_t n);
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  std::uint32_t top_k_;
  std::uint64_t hash_;
  std::size_t expected_ = 0, written_ = 0;
};

}  // namespace promptly::quality
