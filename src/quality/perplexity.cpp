#include "quality/perplexity.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include "quality/logits_file.h"
#include "util/clock.h"
#include "util/error.h"

namespace promptly::quality {
namespace {

struct LogSoftmax {
  float max = 0;
  double log_sum = 0;  // log sum exp(logit - max)
  std::size_t argmax = 0;
};

LogSoftmax log_softmax_of(const float* logits, std::size_t n_vocab) {
  LogSoftmax r;
  r.max = logits[0];
  for (std::size_t i = 1; i < n_vocab; ++i) {
    if (logits[i] > r.max) {
      r.max = logits[i];
      r.argmax = i;
    }
  }
  double sum = 0;
  for (std::size_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - r.max));
  r.log_sum = std::log(sum);
  return r;
}

double logp(const LogSoftmax& s, float logit) { return static_cast<double>(logit - s.max) - s.log_sum; }

// One model's logits for the scored positions of the chunks evaluated side by side.
class ChunkEvaluator {
 public:
  ChunkEvaluator(const Model& model, const ChunkPlan& plan, std::size_t seqs_per_pass, std::size_t pass_tokens, KvType kv_type)
      : model_(model),
        plan_(plan),
        pass_tokens_(pass_tokens),
        cache_(model.make_cache(plan.ctx, kv_type, seqs_per_pass)),
        rows_(seqs_per_pass) {}

  // chunks[s] points at ctx tokens (BOS first) for s < n; afterwards rows(s) holds
  // scored_per_chunk() x n_vocab logits of chunk s.
  void evaluate(const std::vector<const std::int32_t*>& chunks, ThreadPool& pool) {
    const std::size_t n_vocab = model_.config().n_vocab, scored = plan_.scored_per_chunk();
    for (std::size_t s = 0; s < chunks.size(); ++s) {
      cache_.erase(static_cast<int>(s));
      rows_[s].resize(scored * n_vocab);
    }
    std::vector<std::size_t> filled(chunks.size(), 0);
    for (std::size_t start = 0; start < plan_.ctx; start += pass_tokens_) {
      const std::size_t end = std::min(plan_.ctx, start + pass_tokens_);
      batch_.clear();
      for (std::size_t s = 0; s < chunks.size(); ++s) {
        for (std::size_t p = start; p < end; ++p) {
          const bool scored_here = p >= plan_.first && p + 1 < plan_.ctx;
          batch_.add(chunks[s][p], static_cast<std::int32_t>(p), static_cast<std::int32_t>(s), scored_here);
        }
      }
      model_.forward(batch_, cache_, pool, logits_);
      // Rows come back in batch order: sequence by sequence, position by position.
      std::size_t row = 0;
      for (std::size_t s = 0; s < chunks.size(); ++s) {
        for (std::size_t p = start; p < end; ++p) {
          if (p < plan_.first || p + 1 >= plan_.ctx) continue;
          std::copy_n(logits_.data() + row * n_vocab, n_vocab, rows_[s].data() + filled[s] * n_vocab);
          ++row;
          ++filled[s];
        }
      }
    }
  }
  const float* row(std::size_t seq, std::size_t i) const { return rows_[seq].data() + i * model_.config().n_vocab; }

 private:
  const Model& model_;
  const ChunkPlan& plan_;
  std::size_t pass_tokens_;
  KvCache cache_;
  Batch batch_;
  std::vector<float> logits_;
  std::vector<std::vector<float>> rows_;
};

}  // namespace

double MeanAccumulator::stderr_of_mean() const {
  if (count < 2) return 0.0;
  const double n = static_cast<double>(count);
  const double var = sum2 / n - (sum / n) * (sum / n);
  return var > 0 ? std::sqrt(var / (n - 1)) : 0.0;
}

ChunkPlan plan_chunks(std::size_t n_tokens, std::size_t ctx, long max_chunks, std::size_t model_ctx) {
  if (ctx < 4) throw Error("--ctx " + std::to_string(ctx) + " is too small: a chunk scores its second half, so it needs at least 4 tokens");
  if (model_ctx > 0 && ctx > model_ctx) {
    throw Error("--ctx " + std::to_string(ctx) + " is larger than the model's context of " + std::to_string(model_ctx) +
                " tokens; use --ctx " + std::to_string(model_ctx) + " or less");
  }
  if (max_chunks < -1 || max_chunks == 0) throw Error("--chunks must be positive (or -1 for all)");
  if (n_tokens < ctx) {
    throw Error("the text has only " + std::to_string(n_tokens) + " tokens, fewer than one chunk of --ctx " + std::to_string(ctx) +
                "; give a longer text or a smaller --ctx");
  }
  ChunkPlan plan;
  plan.ctx = ctx;
  plan.first = ctx / 2;
  plan.n_chunks = n_tokens / ctx;
  if (max_chunks > 0) plan.n_chunks = std::min(plan.n_chunks, static_cast<std::size_t>(max_chunks));
  return plan;
}

double token_nll(const float* logits, std::size_t n_vocab, std::int32_t token) {
  const LogSoftmax s = log_softmax_of(logits, n_vocab);
  return -logp(s, logits[token]);
}

float top_k_record(const float* logits, std::size_t n_vocab, std::int32_t actual, std::size_t k, std::int32_t* ids, float* logps) {
  const LogSoftmax s = log_softmax_of(logits, n_vocab);
  std::vector<std::int32_t> order(n_vocab);
  std::iota(order.begin(), order.end(), 0);
  k = std::min(k, n_vocab);
  // Ties break toward the lower id, as the argmax does, so ids[0] is the argmax.
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), [&](std::int32_t a, std::int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  for (std::size_t i = 0; i < k; ++i) {
    ids[i] = order[i];
    logps[i] = static_cast<float>(logp(s, logits[order[i]]));
  }
  return static_cast<float>(logp(s, logits[actual]));
}

PositionDivergence compare_full(const float* ref_logits, const float* cand_logits, std::size_t n_vocab) {
  const LogSoftmax r = log_softmax_of(ref_logits, n_vocab), c = log_softmax_of(cand_logits, n_vocab);
  double kld = 0;
  for (std::size_t i = 0; i < n_vocab; ++i) {
    const double lr = logp(r, ref_logits[i]);
    kld += std::exp(lr) * (lr - logp(c, cand_logits[i]));
  }
  PositionDivergence d;
  d.kld = std::max(0.0, kld);  // rounding can leave -1e-17 where the two agree
  d.same_top = r.argmax == c.argmax;
  d.top_p_drop = std::exp(logp(r, ref_logits[r.argmax])) - std::exp(logp(c, cand_logits[r.argmax]));
  return d;
}

PositionDivergence compare_top_k(const TopKRecord& ref, const float* cand_logits, std::size_t n_vocab) {
  const LogSoftmax c = log_softmax_of(cand_logits, n_vocab);
  double kld = 0, ref_mass = 0, cand_mass = 0;
  for (std::size_t i = 0; i < ref.k; ++i) {
    const double lr = ref.logps[i], lc = logp(c, cand_logits[ref.ids[i]]);
    const double pr = std::exp(lr);
    kld += pr * (lr - lc);
    ref_mass += pr;
    cand_mass += std::exp(lc);
  }
  const double ref_rest = 1.0 - ref_mass, cand_rest = 1.0 - cand_mass;
  if (ref_rest > 1e-12) kld += ref_rest * (std::log(ref_rest) - std::log(std::max(cand_rest, 1e-30)));
  PositionDivergence d;
  d.kld = std::max(0.0, kld);
  d.same_top = static_cast<std::int32_t>(c.argmax) == ref.ids[0];
  d.top_p_drop = std::exp(static_cast<double>(ref.logps[0])) - std::exp(logp(c, cand_logits[ref.ids[0]]));
  return d;
}

double percentile(const std::vector<float>& sorted, double fraction) {
  if (sorted.empty()) return 0.0;
  if (fraction <= 0) return sorted.front();
  if (fraction >= 1) return sorted.back();
  const double p = fraction * static_cast<double>(sorted.size() - 1);
  const std::size_t i = static_cast<std::size_t>(p);
  const double t = p - static_cast<double>(i);
  return (1 - t) * sorted[i] + t * sorted[std::min(i + 1, sorted.size() - 1)];
}

double PerplexityResult::ppl() const { return std::exp(nll.mean()); }
double PerplexityResult::ppl_stderr() const { return nll.stderr_of_mean() * ppl(); }
double PerplexityResult::tokens_per_s() const {
  return seconds > 0 ? static_cast<double>(plan.n_chunks * plan.ctx) / seconds : 0.0;
}

PerplexityResult evaluate_perplexity(const PerplexityRun& run, const std::vector<std::int32_t>& tokens, std::int32_t bos,
                                     const PerplexityOptions& options, ThreadPool& pool,
                                     const std::function<void(std::size_t, const PerplexityResult&)>& on_chunk) {
  if (!run.model) throw Error("perplexity: no model");
  const Model& model = *run.model;
  const std::size_t n_vocab = model.config().n_vocab;
  if (run.reference && run.reference_file) throw Error("--kld-ref and --kld-base are two ways to give the reference: give one");
  if (run.reference && run.reference->config().n_vocab != n_vocab) {
    throw Error("the reference model has " + std::to_string(run.reference->config().n_vocab) + " tokens in its vocabulary, the model " +
                std::to_string(n_vocab) + ": KL divergence needs the same vocabulary");
  }
  const LogitsFile* base = run.reference_file;
  if (base && base->n_vocab != n_vocab) {
    throw Error("the logits file was saved from a model with " + std::to_string(base->n_vocab) + " tokens in its vocabulary, this model has " +
                std::to_string(n_vocab));
  }

  PerplexityResult result;
  std::vector<std::int32_t> chunk_tokens;
  if (base) {
    // The chunks are the file's: the text, when given too, must be the one they were saved from.
    result.plan.ctx = base->ctx;
    result.plan.first = base->first;
    result.plan.n_chunks = base->n_chunks;
    if (base->ctx > model.config().n_ctx_train && model.config().n_ctx_train > 0) {
      throw Error("the logits file was saved with --ctx " + std::to_string(base->ctx) + ", more than this model's context of " +
                  std::to_string(model.config().n_ctx_train));
    }
    if (options.max_chunks > 0) result.plan.n_chunks = std::min<std::size_t>(base->n_chunks, static_cast<std::size_t>(options.max_chunks));
    chunk_tokens.assign(base->tokens.begin(), base->tokens.begin() + static_cast<std::ptrdiff_t>(result.plan.n_chunks * result.plan.ctx));
    if (!tokens.empty()) {
      const ChunkPlan own = plan_chunks(tokens.size(), base->ctx, -1, 0);
      for (std::size_t i = 0; i < chunk_tokens.size(); ++i) {
        const bool chunk_start = i % base->ctx == 0;
        if (i >= own.n_chunks * own.ctx || (!chunk_start && tokens[i] != chunk_tokens[i])) {
          throw Error("the text differs from the one the logits file was saved from (first at token " + std::to_string(i) +
                      "); give the same file with -f, or leave -f out");
        }
      }
    }
  } else {
    result.plan = plan_chunks(tokens.size(), options.ctx, options.max_chunks, model.config().n_ctx_train);
    chunk_tokens.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(result.plan.n_chunks * result.plan.ctx));
    if (bos >= 0) {
      for (std::size_t c = 0; c < result.plan.n_chunks; ++c) chunk_tokens[c * result.plan.ctx] = bos;
    }
  }
  const ChunkPlan& plan = result.plan;
  for (std::int32_t t : chunk_tokens) {
    if (t < 0 || static_cast<std::size_t>(t) >= n_vocab) throw Error("token id " + std::to_string(t) + " is outside the model's vocabulary");
  }

  std::size_t seqs_per_pass = 1, pass_tokens = plan.ctx;
  if (options.batch > 0 && options.batch < plan.ctx) {
    pass_tokens = options.batch;
  } else if (options.batch > plan.ctx) {
    if (options.batch % plan.ctx != 0) {
      throw Error("--batch " + std::to_string(options.batch) + " is above --ctx " + std::to_string(plan.ctx) +
                  " but not a multiple of it (several chunks run side by side)");
    }
    seqs_per_pass = options.batch / plan.ctx;
  }

  const bool kl_mode = run.reference || base;
  const Model* saved_model = run.reference ? run.reference : &model;
  std::unique_ptr<LogitsWriter> writer;
  const std::size_t top_k = std::min<std::size_t>(options.top_k, n_vocab);
  if (!run.save_logits_path.empty()) {
    if (base) throw Error("--save-logits writes a reference's logits; it cannot be combined with --kld-base");
    if (top_k == 0) throw Error("--top-k must be at least 1");
    writer = std::make_unique<LogitsWriter>(run.save_logits_path, static_cast<std::uint32_t>(n_vocab), plan,
                                            static_cast<std::uint32_t>(top_k), chunk_tokens);
  }
  if (kl_mode) result.kl.emplace();

  ChunkEvaluator cand(model, plan, seqs_per_pass, pass_tokens, options.kv_type);
  std::unique_ptr<ChunkEvaluator> ref;
  if (run.reference) ref = std::make_unique<ChunkEvaluator>(*run.reference, plan, seqs_per_pass, pass_tokens, options.kv_type);

  const std::size_t scored = plan.scored_per_chunk();
  std::vector<double> nll(scored), ref_nll(scored);
  std::vector<PositionDivergence> div(scored);
  std::vector<std::int32_t> saved_ids(scored * top_k);
  std::vector<float> saved_logps(scored * top_k), saved_actual(scored);

  const auto t0 = SteadyClock::now();
  for (std::size_t c0 = 0; c0 < plan.n_chunks; c0 += seqs_per_pass) {
    std::vector<const std::int32_t*> group;
    for (std::size_t c = c0; c < std::min(plan.n_chunks, c0 + seqs_per_pass); ++c) group.push_back(chunk_tokens.data() + c * plan.ctx);
    cand.evaluate(group, pool);
    if (ref) ref->evaluate(group, pool);
    for (std::size_t s = 0; s < group.size(); ++s) {
      const std::size_t chunk = c0 + s;
      const std::int32_t* toks = group[s];
      // Per position in parallel, summed in position order afterwards: the figures do not depend
      // on the thread count.
      pool.parallel_for(scored, 8, [&](std::size_t begin, std::size_t end, int) {
        for (std::size_t i = begin; i < end; ++i) {
          const std::int32_t next = toks[plan.first + i + 1];
          const float* row = cand.row(s, i);
          nll[i] = token_nll(row, n_vocab, next);
          if (ref) {
            ref_nll[i] = token_nll(ref->row(s, i), n_vocab, next);
            div[i] = compare_full(ref->row(s, i), row, n_vocab);
          } else if (base) {
            const TopKRecord rec = base->record(chunk * scored + i);
            ref_nll[i] = -static_cast<double>(rec.actual_logp);
            div[i] = compare_top_k(rec, row, n_vocab);
          }
          if (writer) {
            const float* saved_row = saved_model == &model ? row : ref->row(s, i);
            saved_actual[i] = top_k_record(saved_row, n_vocab, next, top_k, saved_ids.data() + i * top_k, saved_logps.data() + i * top_k);
          }
        }
      });
      for (std::size_t i = 0; i < scored; ++i) {
        result.nll.add(nll[i]);
        if (kl_mode) {
          KlSummary& kl = *result.kl;
          kl.ref_nll.add(ref_nll[i]);
          kl.kld.add(div[i].kld);
          kl.same_top += div[i].same_top ? 1 : 0;
          kl.kld_values.push_back(static_cast<float>(div[i].kld));
          kl.top_p_drop_values.push_back(static_cast<float>(div[i].top_p_drop));
        }
        if (writer) writer->append(saved_actual[i], saved_ids.data() + i * top_k, saved_logps.data() + i * top_k);
      }
      result.running_ppl.push_back(result.ppl());
      result.seconds = seconds_since(t0);
      if (on_chunk) on_chunk(chunk, result);
    }
  }
  result.seconds = seconds_since(t0);
  if (writer) writer->finish();
  if (result.kl) {
    std::sort(result.kl->kld_values.begin(), result.kl->kld_values.end());
    std::sort(result.kl->top_p_drop_values.begin(), result.kl->top_p_drop_values.end());
  }
  return result;
}

}  // namespace promptly::quality
