#pragma once
// Random-weight llama-family models at real shapes (`promptly gen-model`), for benchmarks and tests
// where no trained checkpoint of that size is available. Weights are scaled so that activations stay
// O(1) through every layer and the logits have a useful spread.
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "util/thread_pool.h"

namespace promptly {

struct SyntheticModelSpec {
  std::string preset;
  std::string arch = "llama";  // "llama" or "qwen2" (adds QKV biases, NeoX rope)
  std::uint32_t n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, n_ff = 0, n_vocab = 0, n_ctx = 2048;
  float rope_freq_base = 10000.0f;
};

// Presets: tiny, tiny-qwen2, 125m, tinyllama-1.1b. Throws Error listing them for an unknown name.
SyntheticModelSpec synthetic_preset(const std::string& name);
std::vector<std::string> synthetic_preset_names();

// A SentencePiece-style vocabulary of exactly n_vocab pieces: <unk>, <s>, </s>, the 256 byte tokens,
// characters, common English words and their prefixes (so real text merges into word pieces), then
// letter combinations.
struct SyntheticVocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<std::int32_t> types;
};
SyntheticVocab synthetic_vocab(std::uint32_t n_vocab);

// Writes the model to `path`. Matrices use `dtype`; norms and biases stay F32. `chat_template`, when
// non-empty, is stored as tokenizer.chat_template.
void write_synthetic_model(const SyntheticModelSpec& spec, DType dtype, std::uint64_t seed, const std::string& path,
                           ThreadPool& pool, const std::string& chat_template = "");

}  // namespace promptly
