#pragma once
// Single-sequence generation: prefill the prompt in chunks, then decode token by token. This is what
// `promptly run` uses; the multi-request scheduler (issue "KV cache and scheduler") builds on the same
// Model::forward batches.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "sampling/sampler.h"
#include "spec/proposer.h"
#include "tokenizer/tokenizer.h"
#include "util/thread_pool.h"

namespace promptly {
namespace grammar {
class GrammarIndex;
}

struct GenerateOptions {
  int max_tokens = 128;
  SamplingParams sampling;
  bool ignore_eos = false;
  std::size_t ctx_size = 0;          // 0: the model's training context
  std::size_t prefill_chunk = 512;   // prompt tokens per forward call
  // F32 keeps results bit-for-bit comparable with reference implementations; F16 halves the cache.
  KvType kv_type = KvType::F32;
  // Speculative decoding: when set, each target pass verifies up to spec_tokens proposed tokens
  // (spec/). The output is the same as without it: token for token when greedy, the same
  // distribution when sampling.
  spec::Proposer* proposer = nullptr;
  std::size_t spec_tokens = 4;
  // Constrained decoding (grammar/): only tokens the grammar allows are sampled, and generation ends
  // when it is complete. Speculation is off for constrained generation.
  std::shared_ptr<const grammar::GrammarIndex> grammar;
  // The KV spool (kv/spool.h) in this directory: the prompt's spooled blocks are read instead of
  // computed, and every full block computed is spooled before generate returns. Empty: none.
  std::string kv_spool_dir;
  // Give back the sliding-window layers' KV behind their window as the context grows (not with a
  // spool, which needs whole blocks).
  bool release_window_kv = true;
  std::uint64_t kv_spool_bytes = std::uint64_t{4} << 30;
};

struct GenerateTimings {
  double prompt_ms = 0;  // prefill wall time
  double ttft_ms = 0;    // from the start of prefill to the first sampled token
  double gen_ms = 0;     // decode wall time after the first token
  std::size_t n_prompt = 0;
  std::size_t n_spooled = 0;      // prompt tokens read back from the KV spool instead of computed
  std::size_t n_gen = 0;
  std::size_t spec_passes = 0;    // target passes after the first token
  std::size_t spec_drafted = 0;   // proposed tokens the target checked
  std::size_t spec_accepted = 0;  // of those, the ones it kept
  // Where decode's time went (after the first token): proposing guesses, and the target's passes
  // (every pass, speculating or not); the rest of gen_ms is verification, sampling and bookkeeping.
  double spec_propose_ms = 0;
  double target_ms = 0;
  std::size_t kv_bytes = 0;       // K/V the cache held at the end
  double prompt_tps() const { return prompt_ms > 0 ? n_prompt * 1000.0 / prompt_ms : 0; }
  // The first token's time belongs to the prompt, so generation speed counts the n_gen - 1 after it.
  double gen_tps() const { return gen_ms > 0 && n_gen > 1 ? (n_gen - 1) * 1000.0 / gen_ms : 0; }
  double accept_rate() const { return spec_drafted ? static_cast<double>(spec_accepted) / static_cast<double>(spec_drafted) : 0.0; }
  // Tokens each target pass after the first token produced (1 without speculation).
  double tokens_per_pass() const { return spec_passes && n_gen > 1 ? static_cast<double>(n_gen - 1) / static_cast<double>(spec_passes) : 0.0; }
};

struct GenerateResult {
  std::vector<std::int32_t> ids;
  std::string text;
  std::string finish_reason;  // "stop" (end-of-generation token) or "length"
  GenerateTimings timings;
  std::vector<std::vector<float>> logits;  // per generated token, only when asked
};

// Appends a proposal's token tree (proposal.parents) to `batch` as the nodes of a tree after the first
// `context` positions of `seq`, every node wanting logits: the batch's rows after the context's last
// token are then verify_tree's rows.
void add_tree(const spec::Proposal& proposal, std::int32_t context, Batch& batch, int seq = 0);

// on_text receives each completed UTF-8 piece as soon as it exists.
GenerateResult generate(const Model& model, const Tokenizer& tokenizer, const std::vector<std::int32_t>& prompt,
                        const GenerateOptions& options, ThreadPool& pool,
                        const std::function<void(const std::string&)>& on_text = {}, bool keep_logits = false);

}  // namespace promptly
