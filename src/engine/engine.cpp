#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <sys/statvfs.h>

#include "backend/device.h"
#include "engine/generate.h"
#include "model/fingerprint.h"
#include "spec/draft_model.h"
#include "spec/ngram.h"
#include "spec/verify.h"
#include "util/error.h"
#include "util/process.h"

namespace promptly {

const char* request_state_name(RequestState s) {
  switch (s) {
    case RequestState::Waiting: return "waiting";
    case RequestState::Prefilling: return "prefilling";
    case RequestState::Decoding: return "decoding";
    case RequestState::Finished: return "finished";
    case RequestState::Preempted: return "preempted";
  }
  return "?";
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "none";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Timeout: return "timeout";
    case FinishReason::Error: return "error";
  }
  return "?";
}

std::size_t parse_memory_size(const std::string& text) {
  const std::string bad = "invalid memory size '" + text + "'; use e.g. 4GiB, 512MiB, 300MB or 25%";
  if (text.empty()) throw Error(bad);
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !(value > 0) || !std::isfinite(value)) throw Error(bad);
  std::string unit(end);
  double scale = 1;
  if (unit == "%") {
    if (value > 100) throw Error(bad);
    return static_cast<std::size_t>(available_memory_bytes() * value / 100.0);
  }
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "K" || unit == "KiB") scale = 1024.0;
  else if (unit == "M" || unit == "MiB") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") scale = 1024.0 * 1024 * 1024;
  else if (unit == "KB") scale = 1e3;
  else if (unit == "MB") scale = 1e6;
  else if (unit == "GB") scale = 1e9;
  else throw Error(bad);
  return static_cast<std::size_t>(value * scale);
}

std::uint64_t parse_disk_size(const std::string& text, const std::string& dir) {
  if (text.empty() || text.back() != '%') return parse_memory_size(text);
  char* end = nullptr;
  const double pct = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || std::string(end) != "%" || !(pct > 0) || pct > 100) {
    throw Error("invalid size '" + text + "'; use e.g. 20GiB or 10% (of the file system holding the directory)");
  }
  // The directory may not exist yet: measure the nearest existing parent's file system.
  std::filesystem::path at = std::filesystem::absolute(dir.empty() ? "." : dir);
  struct statvfs fs {};
  while (::statvfs(at.c_str(), &fs) != 0) {
    if (!at.has_parent_path() || at.parent_path() == at) throw Error("cannot measure the file system of '" + dir + "'");
    at = at.parent_path();
  }
  return static_cast<std::uint64_t>(static_cast<double>(fs.f_blocks) * static_cast<double>(fs.f_frsize) * pct / 100.0);
}

namespace {

KvCache make_engine_cache(const Model& model, const EngineOptions& o, std::size_t ctx) {
  const ModelConfig& c = model.config();
  // On a GPU the blocks' contents live in device memory (backend/device.h), and the budget is the
  // device's: what is free after the weights, less room for a pass's activations and cuBLAS.
  const backend::DeviceForward* device = model.device();
  const std::size_t block_bytes =
      device ? device->kv_block_bytes(o.block_tokens) : BlockPool::block_bytes(c.n_layer, c.kv_dim(), o.block_tokens, o.kv_type);
  std::size_t budget = o.kv_memory;
  if (budget == 0) {
    const std::size_t blocks_per_ctx = (ctx + o.block_tokens - 1) / o.block_tokens;
    constexpr std::size_t kDeviceHeadroom = std::size_t{2} << 30;
    const std::size_t device_free = device ? device->free_memory_bytes() / 10 * 9 : 0;
    const std::size_t memory = device ? (device_free > kDeviceHeadroom ? device_free - kDeviceHeadroom : 0) : available_memory_bytes() / 2;
    budget = std::min(8 * blocks_per_ctx * block_bytes, memory);
  }
  std::size_t n_blocks = budget / block_bytes;
  if (n_blocks < 2) {
    throw Error("KV memory budget of " + std::to_string(budget) + " bytes holds fewer than 2 blocks of " +
                std::to_string(o.block_tokens) + " tokens (" + std::to_string(block_bytes) + " bytes each); raise --kv-memory");
  }
  // (A GPU keeps every layer of a block together: no local layers apart there.)
  const LocalLayers local = o.release_window_kv && !device ? model.local_layers() : LocalLayers{};
  std::size_t n_segments = 0;
  if (local.window > 0) {
    // The sliding-window layers' KV is needed only for what running sequences' windows reach (and
    // a step's new tokens, and guesses): that many segments; the rest of the budget holds more
    // blocks of the other layers. A budget too small for that keeps one segment per block.
    const std::size_t n_local = static_cast<std::size_t>(std::count(local.is_local.begin(), local.is_local.end(), true));
    const std::size_t local_bytes = BlockPool::block_bytes(n_local, c.kv_dim(), o.block_tokens, o.kv_type);
    const std::size_t global_bytes = block_bytes - local_bytes;
    const std::size_t per_sequence = (local.window + o.spec_tokens) / o.block_tokens + 3;
    const std::size_t wanted = o.max_running * per_sequence + (o.max_batch_tokens + o.block_tokens - 1) / o.block_tokens + 1;
    if (global_bytes > 0 && wanted < n_blocks && wanted * local_bytes < budget) {
      n_segments = wanted;
      n_blocks = std::max(n_segments, (budget - wanted * local_bytes) / global_bytes);
    }
  }
  KvCache cache = KvCache::with_blocks(c.n_layer, c.kv_dim(), n_blocks, ctx, device ? backend::kDeviceKvType : o.kv_type, o.block_tokens,
                                       c.head_dim, local, n_segments);
  if (device) model.device()->attach_kv(cache);
  return cache;
}

std::unique_ptr<KvSpool> make_spool(const Model& model, const EngineOptions& o, const KvCache& cache) {
  // Under tensor parallelism each rank holds its own heads' part of every block: a spool would need
  // all of them (not done yet), so it stays off. (A GPU's blocks go through KvCache::DeviceState.)
  if (o.kv_spool_dir.empty() || model.tensor_parallel()) return nullptr;
  SpoolOptions so;
  so.dir = o.kv_spool_dir;
  so.max_bytes = o.kv_spool_bytes;
  return std::make_unique<KvSpool>(so, SpoolSettings::of(model_fingerprint(model.file()), cache.pool(), model.config().n_layer));
}

// The step cost model's prior, from forward passes on a scratch sequence of the engine's own cache
// before the first request: one token (mostly the weights streaming through once: the fixed cost)
// and a short prompt (the cost per token on top of it), each the best of a few passes after a
// warm-up (the first pass faults in the mapped weights). The attention term starts from the FLOP
// ratio of one attended position to one token's matrix products, at a third of the matrices'
// efficiency (float attention against int8 matrices: ~3.2x per FLOP measured on TinyLlama at 2000
// positions); the live steps correct it.
StepCostModel calibrate_step_cost(const Model& model, KvCache& cache, ThreadPool& pool) {
  constexpr int kScratchSeq = 0x7fffffff;  // above every request's sequence id for 2^31 requests
  constexpr std::size_t kPromptTokens = 32;
  constexpr double kTimeBudgetS = 0.5;  // passes repeat while under this (a big model's run once)
  const ModelConfig& c = model.config();
  const std::size_t capacity = cache.pool().n_blocks() * cache.block_tokens();
  const std::size_t n = std::min({kPromptTokens, capacity - 1, cache.max_positions()});
  Batch batch;
  std::vector<float> logits;
  auto pass = [&](std::size_t n_tokens) {
    batch.clear();
    for (std::size_t i = 0; i < n_tokens; ++i) {
      batch.add(static_cast<std::int32_t>(i % c.n_vocab), static_cast<std::int32_t>(i), kScratchSeq, i + 1 == n_tokens);
    }
    cache.erase(kScratchSeq);
    if (!cache.try_reserve(kScratchSeq, n_tokens)) return -1.0;
    const auto t0 = SteadyClock::now();
    model.forward(batch, cache, pool, logits);
    return std::chrono::duration<double>(SteadyClock::now() - t0).count();
  };
  pass(1);  // warm-up
  double one = 1e30, many = 1e30, spent = 0;
  for (int i = 0; i < 8 && (i == 0 || spent < kTimeBudgetS); ++i) {
    const double a = pass(1), b = pass(n);
    if (a < 0 || b < 0) break;
    one = std::min(one, a);
    many = std::min(many, b);
    spent += a + b;
  }
  cache.erase(kScratchSeq);
  if (one > 1e29) return StepCostModel(1e-3, 1e-4, 1e-8);  // no room to calibrate: the live steps will teach it
  const double per_token = n > 1 ? std::max(many - one, 0.0) / static_cast<double>(n - 1) : one;
  const double d = c.n_embd, layers = c.n_layer;
  const double matrix_ops = 2 * (layers * (d * (c.q_dim() + 2.0 * c.kv_dim()) + c.q_dim() * d + 3 * d * c.n_ff) + d * c.n_vocab);
  const double attention_ops_per_position = 4 * layers * c.n_head * c.head_dim;
  const double per_attended = 3 * per_token * attention_ops_per_position / matrix_ops;
  return StepCostModel(std::max(one - per_token, 0.0), per_token, per_attended);
}

}  // namespace

Engine::Engine(const Model& model, const Tokenizer* tokenizer, EngineOptions options)
    : model_(model),
      tokenizer_(tokenizer),
      options_(options),
      ctx_(options.ctx_size ? options.ctx_size : model.config().n_ctx_train),
      pool_(options.threads > 0 ? options.threads : default_thread_count()),
      cache_(make_engine_cache(model, options_, ctx_)),
      spool_(make_spool(model, options_, cache_)),
      cost_(calibrate_step_cost(model, cache_, pool_)),
      scheduler_(cache_, SchedulerOptions{std::max<std::size_t>(1, options.max_running), options.prefix_cache,
                                          // Running a follow-up alone skips the streams' tokens for a step:
                                          // not under an ITL target.
                                          options.itl_target_ms > 0 ? 0 : options.short_prompt_first,
                                          options.shortest_prefill_first}),
      mask_worker_(grammar::MaskWorker::spare_core(pool_.size())) {
  if (options_.max_batch_tokens == 0) throw Error("--max-batch-tokens must be at least 1");
  if (model_.tensor_parallel()) cache_.pool().log_copies(true);  // the other ranks repeat them (Model::forward)
  if (tokenizer_) eog_ids_ = tokenizer_->vocab().end_of_generation_ids();
  if (options_.spec == EngineOptions::Spec::Ngram) ngram_ = std::make_unique<spec::NgramProposer>(options_.spec_ngram);
  if ((options_.spec == EngineOptions::Spec::Draft || options_.spec == EngineOptions::Spec::Tree) && !options_.draft) {
    throw Error("speculation with a draft model needs the draft model");
  }
  spec_accepted_per_pos_.assign(options_.spec_tokens, 0);
  if (spool_) {
    scheduler_.set_spool(spool_.get());
    spool_->set_on_read_done([this] { wake_.notify_one(); });
  }
  publish_stats();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  // The spool's reader calls back into wake_, which goes before spool_ would: stop it first.
  spool_.reset();
}

std::uint64_t Engine::submit(Request request) {
  const std::size_t n_vocab = model_.config().n_vocab;
  if (request.prompt.empty()) throw Error("the prompt has no tokens");
  for (std::int32_t t : request.prompt) {
    if (t < 0 || static_cast<std::size_t>(t) >= n_vocab) {
      throw Error("prompt token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(n_vocab));
    }
  }
  if (request.prompt.size() >= ctx_) {
    throw Error("the prompt has " + std::to_string(request.prompt.size()) + " tokens but the context holds " + std::to_string(ctx_) +
                " (at least one must be left to generate)");
  }
  const std::size_t capacity = cache_.pool().n_blocks() * cache_.block_tokens();
  if (request.prompt.size() >= capacity) {
    throw Error("the prompt has " + std::to_string(request.prompt.size()) + " tokens but the KV cache budget holds " +
                std::to_string(capacity) + " (raise --kv-memory)");
  }
  if (!request.stop.empty() && !tokenizer_) throw Error("stop strings need a tokenizer");
  for (const std::string& s : request.stop) {
    if (s.empty()) throw Error("stop strings must not be empty");
  }
  for (const auto& [token, bias] : request.logit_bias) {
    if (token < 0 || static_cast<std::size_t>(token) >= n_vocab) {
      throw Error("logit_bias token id " + std::to_string(token) + " is outside the vocabulary of " + std::to_string(n_vocab));
    }
  }
  if (request.grammar && request.grammar->vocab().size() > n_vocab) {
    throw Error("the grammar was built for a vocabulary of " + std::to_string(request.grammar->vocab().size()) +
                " tokens but the model has " + std::to_string(n_vocab));
  }

  std::unique_lock lock(mutex_);
  if (stopping_) throw Error("the engine is shutting down");
  const std::uint64_t id = next_id_++;
  auto seq = std::make_unique<Sequence>(id, id, std::move(request));
  seq->times.arrival = SteadyClock::now();
  if (seq->request.timeout_s > 0) {
    seq->deadline = seq->times.arrival + std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(seq->request.timeout_s));
  }
  const std::size_t room = ctx_ - seq->n_prompt;
  seq->max_new = seq->request.max_tokens < 0 ? room : std::min<std::size_t>(room, static_cast<std::size_t>(seq->request.max_tokens));
  if (tokenizer_) seq->detokenizer = std::make_unique<StreamingDetokenizer>(*tokenizer_, seq->tokens);
  seq->callback = std::make_shared<const EventCallback>(std::move(seq->request.on_event));
  if (seq->request.grammar) {
    seq->constraint = std::make_unique<grammar::ConstrainedStream>(seq->request.grammar);
    mask_worker_.request(*seq->constraint);  // the first mask, while the prompt is computed
  }
  inbox_.push_back(std::move(seq));
  live_.push_back(id);
  lock.unlock();
  wake_.notify_one();
  return id;
}

bool Engine::cancel(std::uint64_t id) {
  {
    std::lock_guard lock(mutex_);
    if (std::find(live_.begin(), live_.end(), id) == live_.end()) return false;
    cancels_.push_back(id);
  }
  wake_.notify_one();
  return true;
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void Engine::loop() {
  for (;;) {
    std::vector<std::uint64_t> cancels;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !inbox_.empty() || !cancels_.empty() || scheduler_.has_work(); });
      if (stopping_) break;
      while (!inbox_.empty()) {
        scheduler_.add(std::move(inbox_.front()));
        inbox_.pop_front();
      }
      cancels.swap(cancels_);
    }
    for (std::uint64_t id : cancels) {
      if (Sequence* s = scheduler_.find(id)) finish(*s, FinishReason::Cancelled);
    }
    const auto now = SteadyClock::now();
    for (Sequence* s : scheduler_.all()) {
      if (s->deadline <= now) finish(*s, FinishReason::Timeout);
    }
    step();
    // Stats first, then the events: whoever reacts to an event sees stats that include it.
    publish_stats();
    deliver_events();
  }
  // Shutdown: everything still queued or running ends as cancelled.
  {
    std::lock_guard lock(mutex_);
    while (!inbox_.empty()) {
      scheduler_.add(std::move(inbox_.front()));
      inbox_.pop_front();
    }
  }
  for (Sequence* s : scheduler_.all()) finish(*s, FinishReason::Cancelled);
  publish_stats();
  deliver_events();
}

StepBudget Engine::step_budget() const {
  // A step never shorter than this many times its fixed cost (the weights streaming through once):
  // below that, prefill would spend more time re-reading weights than computing (at 5x, 80% of a
  // step is its tokens' work), which happens for models whose single pass is slow on this machine.
  constexpr double kMinStepOverFixed = 5;
  StepBudget b{options_.max_batch_tokens, 0, &cost_};
  if (options_.itl_target_ms > 0) {
    b.max_seconds = std::max(EngineOptions::kItlHeadroom * options_.itl_target_ms / 1000.0 / overrun_.p99(), kMinStepOverFixed * cost_.fixed_s());
  }
  return b;
}

bool Engine::newcomer_preempts(const StepPlan& plan, std::size_t& judged) const {
  std::lock_guard lock(mutex_);
  // The inbox only grows while a step runs: each newcomer is judged once.
  for (; judged < inbox_.size(); ++judged) {
    if (scheduler_.gives_way(plan, *inbox_[judged])) return true;
  }
  return false;
}

void Engine::step() {
  const StepBudget budget = step_budget();
  StepPlan plan = scheduler_.plan(budget);
  for (auto& [seq, reason] : scheduler_.take_ended()) {
    // Already out of the scheduler: announce it.
    Sequence& s = *seq;
    finish(s, reason);
  }
  if (plan.batch.size() == 0) {
    // Nothing could run (every request waits on memory another holds): let time pass, not spin.
    if (scheduler_.has_work()) {
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, std::chrono::milliseconds(1));
    }
    return;
  }
  // Busy from here: the batch is computed. Planning an empty step and waiting are idle time.
  const BusyMeter::Step busy_step(busy_);
  const std::vector<std::size_t> first_row = add_guesses(plan);
  // The streams to sample, and which of them the device draws (draw_of: index into its draws, or -1).
  std::vector<Sequence*> sampled;
  std::vector<std::size_t> chunk_of;
  std::vector<std::ptrdiff_t> draw_of;
  device_sampling_.draws.clear();
  device_sampling_.tokens.clear();
  for (std::size_t ci = 0; ci < plan.chunks.size(); ++ci) {
    if (!plan.chunks[ci].sample) continue;
    Sequence& s = *plan.chunks[ci].seq;
    sampled.push_back(&s);
    chunk_of.push_back(ci);
    draw_of.push_back(-1);
    if (!draws_on_device(s, guesses_[ci])) continue;
    const SamplingParams& p = s.request.sampling;
    draw_of.back() = static_cast<std::ptrdiff_t>(device_sampling_.draws.size());
    // The uniform is only taken from the generator once the pass has run (below).
    device_sampling_.draws.push_back({static_cast<std::int32_t>(first_row[ci]), p.temperature, p.top_k, p.top_p, p.min_p,
                                      p.temperature > 0.0f ? s.sampler.next_uniform() : 0.0});
  }
  const auto t0 = SteadyClock::now();
  // A follow-up arriving while this step runs may have it stop at a layer boundary, while at most
  // half of its layers have run (past that, finishing costs the newcomer less than the others lose).
  std::function<bool(std::size_t)> stop_before;
  if (plan.may_give_way) {
    stop_before = [&, judged = std::size_t{0}](std::size_t layer) mutable {
      return 2 * layer <= model_.config().n_layer && newcomer_preempts(plan, judged);
    };
  }
  try {
    if (!model_.forward(plan.batch, cache_, pool_, logits_, stop_before, device_sampling_.draws.empty() ? nullptr : &device_sampling_)) {
      scheduler_.interrupted();
      ++steps_interrupted_;
      return;
    }
  } catch (const std::exception& e) {
    for (const StepPlan::Chunk& c : plan.chunks) finish(*c.seq, FinishReason::Error, e.what());
    return;
  }
  if (device_sampling_.tokens.size() != device_sampling_.draws.size()) {
    for (const StepPlan::Chunk& c : plan.chunks) finish(*c.seq, FinishReason::Error, "internal error: the device drew no tokens for its rows");
    return;
  }
  const double attended = StepCostModel::attended_by(plan.batch.positions);
  const double step_s = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  const double predicted_s = cost_.predict(static_cast<double>(plan.batch.size()), attended);
  // PROMPTLY_STEP_LOG=1: one line a step on stderr, for seeing how steps are sized and what they cost.
  static const bool log_steps = std::getenv("PROMPTLY_STEP_LOG") != nullptr;
  if (log_steps) {
    std::fprintf(stderr, "step tokens=%zu decode=%zu attended=%.0f predicted_ms=%.1f actual_ms=%.1f limit_ms=%.1f overrun_p99=%.2f\n",
                 plan.batch.size(), plan.n_decode, attended, predicted_s * 1000, step_s * 1000, budget.max_seconds * 1000, overrun_.p99());
  }
  // Only steps the limit shaped tell how far limited steps overrun (a short decode step's relative
  // jitter is larger and irrelevant to the limit).
  if (budget.max_seconds > 0 && predicted_s > 0.5 * budget.max_seconds) overrun_.observe(predicted_s, step_s);
  cost_.observe(static_cast<double>(plan.batch.size()), attended, step_s);
  ++steps_;
  scheduler_.commit(plan);
  // The picks in parallel (the pool is idle between forward passes; a draw over a whole vocabulary
  // is tens to hundreds of microseconds, per stream), then their effects in batch order.
  // A speculated stream's rows are verified instead (its committed tokens: the accepted guesses,
  // then the target's own).
  std::vector<Pick> picks(sampled.size());
  std::vector<std::vector<std::int32_t>> committed(sampled.size());
  std::vector<std::size_t> accepted(sampled.size(), 0);
  std::vector<std::vector<std::size_t>> tree_paths(sampled.size());  // a tree's accepted nodes, root to leaf
  const std::size_t n_vocab = model_.config().n_vocab;
  pool_.parallel_for(sampled.size(), 1, [&](std::size_t b, std::size_t e, int) {
    std::vector<float> p;
    for (std::size_t i = b; i < e; ++i) {
      const std::size_t ci = chunk_of[i];
      float* rows = &logits_[first_row[ci] * n_vocab];
      if (draw_of[i] >= 0) {
        picks[i].id = device_sampling_.tokens[static_cast<std::size_t>(draw_of[i])];
        if (sampled[i]->request.sampling.temperature > 0.0f) sampled[i]->sampler.skip_uniform();
      } else if (guesses_[ci].tokens.empty()) {
        picks[i] = pick(*sampled[i], rows);
      } else if (guesses_[ci].is_tree()) {
        accepted[i] = spec::verify_tree(rows, n_vocab, guesses_[ci], sampled[i]->tokens, sampled[i]->sampler, p, committed[i], tree_paths[i]);
      } else {
        accepted[i] = spec::verify_chain(rows, n_vocab, guesses_[ci], sampled[i]->tokens, sampled[i]->sampler, p, committed[i]);
      }
    }
  });
  for (std::size_t i = 0; i < sampled.size(); ++i) {
    Sequence& s = *sampled[i];
    const spec::Proposal& g = guesses_[chunk_of[i]];
    if (g.tokens.empty()) {
      if (draw_of[i] >= 0) ++device_sampled_tokens_;
      accept(s, std::move(picks[i]));
      continue;
    }
    ++spec_drafts_;
    spec_draft_tokens_ += g.tokens.size();
    spec_accepted_tokens_ += accepted[i];
    for (std::size_t pos = 0; pos < accepted[i] && pos < spec_accepted_per_pos_.size(); ++pos) ++spec_accepted_per_pos_[pos];
    // A tree's accepted nodes move down behind the stream's token (s.n_computed: the tree's context),
    // in path order so that no move overwrites a node still to come; its other nodes are left past
    // the computed tokens, as a chain's rejected guesses are.
    for (std::size_t j = 0; j < tree_paths[i].size(); ++j) {
      scheduler_.cache().move_position(s.seq_id, s.n_computed + tree_paths[i][j], s.n_computed + j);
    }
    for (std::size_t j = 0; j < committed[i].size(); ++j) {
      if (!accept(s, Pick{committed[i][j], 0.0f, {}})) break;  // finished: s is gone
      // An accepted guess's K/V, computed this step from the token now before it, becomes part of
      // the sequence: only now, so that the computed tokens never run ahead of the sequence.
      if (j < accepted[i]) scheduler_.accept_guess(s);
    }
  }
}

bool Engine::draws_on_device(const Sequence& s, const spec::Proposal& guesses) const {
  return model_.samples_on_device() && guesses.tokens.empty() && s.request.top_logprobs < 0 && s.request.logit_bias.empty() && !s.constraint &&
         !s.request.sampling.penalizes();
}

spec::Proposer* Engine::proposer_for(Sequence& s) {
  if (options_.spec == EngineOptions::Spec::Ngram) return ngram_.get();
  auto& draft = drafts_[s.id];
  if (!draft) {
    spec::DraftOptions d;
    d.ctx = ctx_;
    d.kv_type = options_.kv_type;
    d.min_confidence = options_.spec_draft_min_p;
    d.sampling = s.request.sampling;
    if (options_.spec == EngineOptions::Spec::Tree) {
      d.tree_width = options_.spec_tree_width;
      d.tree_depth = options_.spec_tree_depth;
      d.tree_min_p = options_.spec_tree_min_p;
    }
    draft = std::make_unique<spec::DraftModelProposer>(*options_.draft, d, pool_);
  }
  return draft.get();
}

std::vector<std::size_t> Engine::add_guesses(StepPlan& plan) {
  std::vector<std::size_t> first_row(plan.chunks.size());
  guesses_.resize(std::max(guesses_.size(), plan.chunks.size()));
  for (auto& g : guesses_) g.clear();
  // Only steps of a few decoding streams and no prompt: see EngineOptions::spec.
  const bool all_decode = std::all_of(plan.chunks.begin(), plan.chunks.end(), [](const StepPlan::Chunk& c) {
    return c.n_tokens == 1 && c.sample && c.seq->state == RequestState::Decoding;
  });
  bool any = false;
  if (options_.spec != EngineOptions::Spec::None && all_decode && plan.n_decode <= options_.spec_max_streams) {
    for (std::size_t ci = 0; ci < plan.chunks.size(); ++ci) {
      Sequence& s = *plan.chunks[ci].seq;
      if (!s.request.speculative || s.request.top_logprobs >= 0 || !s.request.logit_bias.empty() || s.constraint) continue;
      if (!options_.spec_sampled && s.request.sampling.temperature > 0) continue;
      const std::size_t left = s.max_new > s.n_generated ? s.max_new - s.n_generated : 0;
      const std::size_t room = std::min(left, ctx_ - std::min(ctx_, s.tokens.size()));
      if (room < 2) continue;
      spec::Proposal& g = guesses_[ci];
      proposer_for(s)->propose(s.tokens, std::min(options_.spec_tokens, room - 1), g);
      // Positions for the token and its guesses; none to spare (another stream's, a cached
      // prefix's): no guesses this step.
      if (!g.tokens.empty() && !scheduler_.reserve_guesses(s, s.n_computed + 1 + g.tokens.size())) g.clear();
      any = any || !g.tokens.empty();
    }
  }
  std::size_t row = 0;
  if (any) plan.batch.clear();
  for (std::size_t ci = 0; ci < plan.chunks.size(); ++ci) {
    const StepPlan::Chunk& c = plan.chunks[ci];
    first_row[ci] = row;
    if (c.sample) row += 1 + guesses_[ci].tokens.size();
    if (!any) continue;
    for (std::size_t i = 0; i < c.n_tokens; ++i) {
      const std::size_t pos = c.seq->n_computed + i;
      plan.batch.add(c.seq->tokens[pos], static_cast<std::int32_t>(pos), c.seq->seq_id, c.sample && i + 1 == c.n_tokens);
    }
    const std::size_t next = c.seq->n_computed + c.n_tokens;
    if (guesses_[ci].is_tree()) {
      add_tree(guesses_[ci], static_cast<std::int32_t>(next), plan.batch, c.seq->seq_id);
      continue;
    }
    for (std::size_t j = 0; j < guesses_[ci].tokens.size(); ++j) {
      plan.batch.add(guesses_[ci].tokens[j], static_cast<std::int32_t>(next + j), c.seq->seq_id, true);
    }
  }
  return first_row;
}

Engine::Pick Engine::pick(Sequence& s, float* logits) const {
  const std::size_t n_vocab = model_.config().n_vocab;
  for (const auto& [token, bias] : s.request.logit_bias) logits[token] += bias;
  if (s.constraint) {
    // Tokens the grammar does not allow get no probability (logprobs below are the constrained
    // distribution's). Ids past the tokenizer's vocabulary are never allowed.
    grammar::mask_logits(mask_worker_.wait(*s.constraint), s.constraint->matcher.index().vocab().size(), logits, n_vocab);
  }
  // Log-probabilities of the model's distribution (after logit_bias and any grammar, before sampling penalties).
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
  double log_norm = 0;
  std::vector<float> raw;
  if (s.request.top_logprobs >= 0) {
    log_norm = log_sum_exp(logits, n_vocab);
    raw.assign(logits, logits + n_vocab);
    const std::size_t k = std::min<std::size_t>(static_cast<std::size_t>(s.request.top_logprobs), n_vocab);
    if (k > 0) {
      std::vector<std::int32_t> ids(n_vocab);
      for (std::size_t i = 0; i < n_vocab; ++i) ids[i] = static_cast<std::int32_t>(i);
      std::partial_sort(ids.begin(), ids.begin() + static_cast<long>(k), ids.end(),
                        [&](std::int32_t a, std::int32_t b) { return raw[a] > raw[b] || (raw[a] == raw[b] && a < b); });
      for (std::size_t i = 0; i < k; ++i) top.push_back({ids[i], static_cast<float>(raw[ids[i]] - log_norm)});
    }
  }
  const std::int32_t id = s.sampler.sample(logits, n_vocab, s.tokens);
  if (!raw.empty()) logprob = static_cast<float>(raw[id] - log_norm);
  return {id, logprob, std::move(top)};
}

bool Engine::accept(Sequence& s, Pick pick) {
  const std::int32_t id = pick.id;
  const auto now = SteadyClock::now();
  if (s.n_generated == 0 && s.times.first_token == SteadyClock::time_point{}) s.times.first_token = now;
  s.times.last_token = now;
  s.state = RequestState::Decoding;
  s.prompt_done = true;

  // A grammar decides when output may end: its end tokens are never text, whatever ignore_eos says.
  const bool end_of_generation = (!s.request.ignore_eos || s.constraint) && std::find(eog_ids_.begin(), eog_ids_.end(), id) != eog_ids_.end();
  if (end_of_generation) {
    finish(s, FinishReason::Stop);
    return false;
  }
  if (s.constraint && !s.constraint->matcher.accept(id)) {
    finish(s, FinishReason::Error, "internal error: a token outside the grammar was sampled");
    return false;
  }
  s.tokens.push_back(id);
  ++s.n_generated;
  ++generation_tokens_;
  if (emit_token(s, id, pick.logprob, std::move(pick.top))) {
    finish(s, FinishReason::Stop);  // a stop string ended it
    return false;
  }
  if (s.constraint && s.constraint->matcher.must_end()) {
    finish(s, FinishReason::Stop);  // the grammar is complete and allows nothing more
    return false;
  }
  if (s.n_generated >= s.max_new || s.tokens.size() >= ctx_) {
    finish(s, FinishReason::Length);
    return false;
  }
  if (s.constraint) mask_worker_.request(*s.constraint);
  return true;
}

bool Engine::emit_token(Sequence& s, std::int32_t id, float logprob, std::vector<TokenLogprob> top) {
  EngineEvent e;
  e.kind = EngineEvent::Kind::Token;
  e.request_id = s.id;
  e.time = s.times.last_token;
  e.token = id;
  e.logprob = logprob;
  e.top_logprobs = std::move(top);
  bool stopped = false;
  if (s.detokenizer) {
    s.held_text += s.detokenizer->push(id);
    const std::vector<std::string>& stops = s.request.stop;
    std::size_t cut = std::string::npos;
    for (const std::string& stop : stops) cut = std::min(cut, s.held_text.find(stop));
    if (cut != std::string::npos) {
      e.text = s.held_text.substr(0, cut);
      s.held_text.clear();
      s.detokenizer.reset();  // whatever follows the stop string is never shown
      stopped = true;
    } else {
      // Hold back the longest tail that could still grow into a stop string.
      std::size_t keep = 0;
      for (const std::string& stop : stops) {
        for (std::size_t n = std::min(stop.size() - 1, s.held_text.size()); n > keep; --n) {
          if (s.held_text.compare(s.held_text.size() - n, n, stop, 0, n) == 0) {
            keep = n;
            break;
          }
        }
      }
      e.text = s.held_text.substr(0, s.held_text.size() - keep);
      s.held_text.erase(0, s.held_text.size() - keep);
    }
  }
  deliver_later(s, std::move(e));
  return stopped;
}

void Engine::finish(Sequence& s, FinishReason reason, const std::string& error) {
  drafts_.erase(s.id);
  if (s.constraint) mask_worker_.forget(*s.constraint);
  std::unique_ptr<Sequence> owned = scheduler_.remove(&s);  // null when the scheduler already let it go
  EngineEvent e;
  e.kind = EngineEvent::Kind::Finished;
  e.request_id = s.id;
  e.finish_reason = reason;
  e.error = error;
  // Text still held back (a possible stop string that never completed, an unfinished UTF-8
  // sequence) is shown now.
  if (s.detokenizer) s.held_text += s.detokenizer->flush();
  e.text = std::move(s.held_text);
  s.state = RequestState::Finished;
  s.times.finished = SteadyClock::now();
  e.time = s.times.finished;
  s.usage.prompt_tokens = s.n_prompt;
  s.usage.completion_tokens = s.n_generated;
  e.usage = s.usage;
  e.times = s.times;
  prompt_tokens_ += s.n_prompt;
  ++finished_[static_cast<int>(reason)];
  {
    std::lock_guard lock(mutex_);
    live_.erase(std::remove(live_.begin(), live_.end(), s.id), live_.end());
  }
  deliver_later(s, std::move(e));
}

void Engine::deliver_later(const Sequence& s, EngineEvent e) {
  if (s.callback && *s.callback) pending_events_.emplace_back(s.callback, std::move(e));
}

void Engine::deliver_events() {
  std::vector<std::pair<std::shared_ptr<const EventCallback>, EngineEvent>> events;
  events.swap(pending_events_);
  for (auto& [callback, event] : events) (*callback)(event);
}

void Engine::set_spool_read_observer(std::function<void(double)> observer) {
  std::lock_guard lock(mutex_);
  spool_read_observer_ = std::move(observer);
}

bool Engine::flush_spool(std::chrono::steady_clock::time_point deadline) { return !spool_ || spool_->flush(deadline); }

void Engine::publish_stats() {
  EngineStats st;
  for (const auto& s : scheduler_.running()) {
    ++st.running;
    st.prefilling += s->state == RequestState::Prefilling;
    st.decoding += s->state == RequestState::Decoding;
  }
  st.waiting = scheduler_.waiting().size();
  const BlockPool& pool = cache_.pool();
  st.kv_blocks_total = pool.n_blocks();
  st.kv_blocks_free = pool.n_free();
  st.kv_blocks_cached = scheduler_.evictable_blocks();
  st.kv_blocks_used = st.kv_blocks_total - st.kv_blocks_free - st.kv_blocks_cached;
  st.kv_block_tokens = cache_.block_tokens();
  const ModelConfig& c = model_.config();
  st.kv_bytes_per_token = BlockPool::block_bytes(c.n_layer, c.kv_dim(), 1, cache_.type());
  st.kv_budget_bytes = pool.capacity_bytes();
  st.kv_bytes_in_use = pool.bytes_in_use();
  st.ctx_size = ctx_;
  const SchedulerCounters& k = scheduler_.counters();
  st.prefix_cache_queries = k.prefix_queries;
  st.prefix_cache_hits = k.prefix_hits;
  st.tokens_computed = k.tokens_computed;
  st.tokens_reused = k.tokens_reused;
  st.preemptions = k.preemptions;
  st.steps_interrupted = steps_interrupted_;
  st.evicted_blocks = k.evicted_blocks;
  st.prompt_tokens = prompt_tokens_;
  st.generation_tokens = generation_tokens_;
  st.device_sampled_tokens = device_sampled_tokens_;
  st.steps = steps_;
  st.step_fixed_ms = cost_.fixed_s() * 1000;
  st.step_per_token_ms = cost_.per_token_s() * 1000;
  st.step_per_1k_attended_ms = cost_.per_attended_s() * 1e6;
  st.step_limit_ms = step_budget().max_seconds * 1000;
  std::copy(std::begin(finished_), std::end(finished_), std::begin(st.finished));
  st.spec_drafts = spec_drafts_;
  st.spec_draft_tokens = spec_draft_tokens_;
  st.spec_accepted_tokens = spec_accepted_tokens_;
  st.spec_accepted_per_pos = spec_accepted_per_pos_;
  st.spool_hit_blocks = k.spool_hit_blocks;
  st.spool_hit_tokens = k.spool_hit_tokens;
  const std::vector<double> read_waits = scheduler_.take_spool_read_waits();
  std::lock_guard lock(mutex_);
  if (spool_read_observer_) {
    for (double w : read_waits) spool_read_observer_(w);
  }
  // Requests still in the inbox are waiting too.
  st.waiting += inbox_.size();
  stats_ = st;
}

}  // namespace promptly
