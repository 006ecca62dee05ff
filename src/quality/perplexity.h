#pragma once
// `promptly perplexity`: how well a model predicts a text, and how far a quantized copy's
// predictions move from its reference's. The method is llama.cpp's `llama-perplexity`, so that the
// figures compare with theirs: the text is tokenized once (with BOS), cut into chunks of `ctx`
// tokens, each chunk is evaluated from BOS (its first token replaced by BOS), and only the second
// half of each chunk is scored (positions ctx/2 .. ctx-2 predict the next token), so every scored
// token has at least ctx/2 tokens of context.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kv/block_pool.h"
#include "model/model.h"
#include "util/thread_pool.h"

namespace promptly::quality {

// Where the chunks lie in the tokenized text.
struct ChunkPlan {
  std::size_t ctx = 0;       // tokens per chunk
  std::size_t n_chunks = 0;
  std::size_t first = 0;     // first scored position of a chunk (ctx / 2)
  std::size_t scored_per_chunk() const { return ctx - 1 - first; }
  std::size_t n_scored() const { return n_chunks * scored_per_chunk(); }
};

// Throws Error with the numbers when the text is shorter than one chunk, ctx is out of range for
// the model, or max_chunks is negative (-1 = all the chunks the text holds).
ChunkPlan plan_chunks(std::size_t n_tokens, std::size_t ctx, long max_chunks, std::size_t model_ctx);

// Sums of a per-token statistic with llama.cpp's standard error of the mean.
struct MeanAccumulator {
  double sum = 0, sum2 = 0;
  std::size_t count = 0;
  void add(double v) {
    sum += v;
    sum2 += v * v;
    ++count;
  }
  double mean() const { return count ? sum / static_cast<double>(count) : 0.0; }
  // sqrt((E[v^2] - E[v]^2) / (n - 1)); 0 when undefined.
  double stderr_of_mean() const;
};

// Negative log-likelihood of `token` under softmax(logits), summing the exponentials in double.
double token_nll(const float* logits, std::size_t n_vocab, std::int32_t token);

// The reference's distribution at one position kept as its top-k log-probabilities (what
// --save-logits stores) plus the log-probability of the token that actually came next.
// A view, so records can live in one flat array (LogitsFile).
struct TopKRecord {
  float actual_logp = 0;
  const std::int32_t* ids = nullptr;  // k ids by decreasing probability; ids[0] is the reference's argmax
  const float* logps = nullptr;       // their log-probabilities
  std::size_t k = 0;
};
// Fills k ids and log-probabilities; returns the log-probability of `actual`.
float top_k_record(const float* logits, std::size_t n_vocab, std::int32_t actual, std::size_t k, std::int32_t* ids, float* logps);

// One position's comparison of a candidate with its reference.
struct PositionDivergence {
  double kld = 0;          // KL(reference || candidate), nats
  bool same_top = false;   // both argmaxes agree
  double top_p_drop = 0;   // p_ref(top) - p_cand(top), top = the reference's argmax
};
// Exact, over the whole vocabulary.
PositionDivergence compare_full(const float* ref_logits, const float* cand_logits, std::size_t n_vocab);
// From a stored top-k: the top-k terms exactly, the rest of the vocabulary as one lumped outcome
// (its probability under each model), which bounds the full KL from below and equals it when the
// two agree on the tail's shape; 0 for a model against its own record.
PositionDivergence compare_top_k(const TopKRecord& ref, const float* cand_logits, std::size_t n_vocab);

struct KlSummary {
  MeanAccumulator kld;
  MeanAccumulator ref_nll;
  std::size_t same_top = 0;
  std::vector<float> kld_values;        // per scored position, for percentiles
  std::vector<float> top_p_drop_values;
};

// Linear interpolation between the order statistics (llama.cpp's percentile rule); `sorted` ascending.
double percentile(const std::vector<float>& sorted, double fraction);

struct PerplexityOptions {
  std::size_t ctx = 512;
  std::size_t batch = 0;  // tokens per forward pass: 0 = ctx; above ctx a multiple of it (chunks side by side)
  long max_chunks = -1;
  KvType kv_type = KvType::F16;  // llama.cpp's default, so figures compare
  std::size_t top_k = 64;        // entries per position in a saved logits file
};

struct PerplexityResult {
  ChunkPlan plan;
  MeanAccumulator nll;
  std::vector<double> running_ppl;  // after each chunk
  double seconds = 0;               // evaluation time (the candidate, and the reference when loaded)
  std::optional<KlSummary> kl;

  double ppl() const;
  double ppl_stderr() const;  // llama.cpp's: stderr of the mean NLL times PPL
  double tokens_per_s() const;
};

class LogitsFile;

struct PerplexityRun {
  const Model* model = nullptr;                 // the candidate (or the only model)
  const Model* reference = nullptr;             // --kld-ref: evaluated on the same chunks
  const LogitsFile* reference_file = nullptr;   // --kld-base: compared against instead
  std::string save_logits_path;                 // --save-logits: the reference's (or the model's) top-k
};

// Evaluates `tokens` (the tokenized text, BOS first when the vocabulary adds one). `bos` replaces
// each chunk's first token (-1: none). `on_chunk(i, result)` is called after each chunk.
PerplexityResult evaluate_perplexity(const PerplexityRun& run, const std::vector<std::int32_t>& tokens, std::int32_t bos,
                                     const PerplexityOptions& options, ThreadPool& pool,
                                     const std::function<void(std::size_t, const PerplexityResult&)>& on_chunk = {});

}  // namespace promptly::quality
