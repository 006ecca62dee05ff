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
  // One of model/arch's architectures: its description decides the tensors written (biases, QK
  // norms, post norms, fused QKV and gate/up) and the metadata keys, as llama.cpp's converter names
  // them. A llama with n_expert > 0 is a Mixtral.
  std::string arch = "llama";
  std::uint32_t n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, n_ff = 0, n_vocab = 0, n_ctx = 2048;
  std::uint32_t head_dim = 0;  // 0: n_embd / n_head (else written as attention.key_length/value_length)
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied_output = false;    // no output.weight: the embedding is the output projection
  std::uint32_t n_expert = 0, n_expert_used = 0, n_ff_expert = 0;  // mixture of experts
  std::uint32_t sliding_window = 0;
  float attn_softcap = 0.0f, final_softcap = 0.0f;  // gemma2
  float rope_linear_factor = 0.0f;                  // rope.scaling.type linear (gemma3 4b+)
  // The family's chat: its special tokens (control tokens in the vocabulary, so that end-of-turn
  // tokens end generation) and a chat template in its format (stored unless the caller gives one).
  std::vector<std::string> special_tokens;
  std::string chat_template;
};

// Presets: tiny, tiny-qwen2, tiny-qwen3, tiny-qwen3moe, tiny-gemma2, tiny-gemma3, tiny-phi3,
// tiny-mixtral (test shapes), 125m, tinyllama-1.1b, llama3-8b, qwen3-0.6b, qwen3-4b, gemma3-1b, gemma2-2b,
// phi3-mini, qwen3-30b-a3b, mixtral-8x7b (real shapes). Throws Error listing them for an unknown name.
SyntheticModelSpec synthetic_preset(const std::string& name);
std::vector<std::string> synthetic_preset_names();

// A SentencePiece-style vocabulary of exactly n_vocab pieces: <unk>, <s>, </s>, the 256 byte tokens,
// characters, common English words and their prefixes (so real text merges into word pieces), then
// letter combinations.
struct SyntheticVocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;  // SentencePiece only
  std::vector<std::int32_t> types;
  std::vector<std::string> merges;  // byte-level BPE only: "left right", highest priority first
};
// `special_tokens` become control tokens right after the byte tokens.
SyntheticVocab synthetic_vocab(std::uint32_t n_vocab, const std::vector<std::string>& special_tokens = {});

// A byte-level BPE vocabulary as Qwen's (tokenizer.ggml.model "gpt2", pre "qwen2"): the 256 byte
// characters of GPT-2's alphabet, merges that build the common words with and without their
// leading space ("Ġ"), then `special_tokens` as control tokens, then unused padding up to n_vocab.
SyntheticVocab synthetic_bpe_vocab(std::uint32_t n_vocab, const std::vector<std::string>& special_tokens);

// Writes the model to `path`. Matrices use `dtype`, or with m_mix (dtype Q3_K, Q4_K or Q5_K) llama.cpp's
// Q3_K_M / Q4_K_M / Q5_K_M mix as `quantize` writes it (convert/file_type.h); norms and biases stay F32. `chat_template`, when
// non-empty, is stored as tokenizer.chat_template (else the preset's own, if it has one).
void write_synthetic_model(const SyntheticModelSpec& spec, DType dtype, std::uint64_t seed, const std::string& path,
                           ThreadPool& pool, const std::string& chat_template = "", bool m_mix = false);

}  // namespace promptly
