#pragma once
// The serving engine: one thread runs the step loop (plan a batch, run the model once, sample, emit
// events) over every request in flight, so all users share each pass over the weights. Any thread
// may submit, cancel and read stats; events arrive through each request's callback on the engine
// thread.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend/device_draw.h"
#include "engine/busy_meter.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/step_cost.h"
#include "kv/kv_cache.h"
#include "kv/spool.h"
#include "model/model.h"
#include "spec/proposer.h"
#include "tokenizer/tokenizer.h"
#include "util/thread_pool.h"

namespace promptly {

struct EngineOptions {
  std::size_t kv_memory = 0;        // KV pool bytes; 0: room for 8 full contexts, at most half the free RAM
  KvType kv_type = KvType::F16;
  std::size_t block_tokens = KvCache::kDefaultBlockTokens;
  std::size_t max_batch_tokens = 512;  // tokens per step, at most
  // > 0: while prompts prefill, decoding streams get a token at least this often (at the 99th
  // percentile): steps are sized, by what steps are measured to cost on this machine
  // (StepCostModel) and how far they overrun their prediction (StepOverrun), to take at most this
  // less kItlHeadroom, so a request arriving also waits at most that long for the step in flight.
  // 0: steps are sized by max_batch_tokens alone (and short prompts run alone, see below). The
  // default, 150 ms (a token ~7 times a second, faster than anyone reads, while prompts prefill),
  // and the measurements behind it: README, Serving defaults.
  double itl_target_ms = kDefaultItlTargetMs;
  static constexpr double kDefaultItlTargetMs = 150;
  // Of the ITL target, what steps may take: the rest is the step loop between forward passes
  // (sampling, events: ~1 ms) and the delivery to the client.
  static constexpr double kItlHeadroom = 0.95;
  // Prompts' chunks first by shortest remaining prefill, with aging (Scheduler::prefill_order).
  bool shortest_prefill_first = true;
  // Without an ITL target: a step that finishes a prompt of at most this many remaining tokens (a
  // chat's follow-up over its cached history) runs it alone, leaving the decode tokens and other
  // prompts to the next step, for its time to first token (see Scheduler::isolate_short_prompt).
  // 0: never.
  std::size_t short_prompt_first = 128;
  std::size_t max_running = 32;
  std::size_t ctx_size = 0;         // per-request positions; 0: the model's training context
  bool prefix_cache = true;
  // The prefix cache's disk tier (kv/spool.h): full blocks are written here behind the steps and
  // read back for prompts that reach them, across restarts. Empty: none.
  std::string kv_spool_dir;
  std::uint64_t kv_spool_bytes = std::uint64_t{4} << 30;  // the spool's size cap
  // Sliding-window models: the local layers' KV of blocks every window has left is given up
  // (Model::local_layers, BlockPool::Hold), so a long conversation keeps only the global layers'
  // full KV resident.
  bool release_window_kv = true;
  int threads = 0;                  // 0: one per core
  // Speculative decoding inside the step: a decoding stream's guesses (n-gram prompt lookup, or a
  // draft model with a KV cache per stream) join the batch after its token and are verified by the
  // same pass (spec/verify.h). Only while the step holds at most spec_max_streams decoding streams
  // and no prompt chunk: with more, the batch already uses the pass's spare arithmetic, and guesses
  // would take it from other streams' tokens. Requests with logprobs or logit_bias are not
  // speculated (their per-token extras are computed row by row on the plain path).
  // Spec::Tree: a token tree from the draft model (spec/draft_model.h), verified under the tree
  // attention mask in the same pass as the other streams' tokens.
  enum class Spec { None, Ngram, Draft, Tree };
  Spec spec = Spec::None;
  const Model* draft = nullptr;     // Spec::Draft and Tree: same vocabulary as the model (checked by the caller)
  std::size_t spec_tokens = spec::kDefaultDraftTokens;  // guesses a stream adds to a step, at most (a tree's nodes)
  std::size_t spec_tree_width = spec::kDefaultTreeWidth;
  std::size_t spec_tree_depth = spec::kDefaultTreeDepth;
  float spec_tree_min_p = spec::kDefaultTreeMinP;
  std::size_t spec_ngram = 3;
  float spec_draft_min_p = spec::kDefaultDraftMinP;
  std::size_t spec_max_streams = 2;
  // false: only greedy requests are speculated. Greedy output is the same token for token either
  // way; a sampled request's draws would depend on which steps speculated, i.e. on the server's load,
  // so a seeded request would no longer repeat itself. serve's default (n-gram lookup) is greedy-only.
  bool spec_sampled = true;
};

struct EngineStats {
  std::size_t running = 0, waiting = 0, prefilling = 0, decoding = 0;
  std::size_t kv_blocks_total = 0, kv_blocks_free = 0, kv_blocks_cached = 0, kv_blocks_used = 0;
  std::size_t kv_block_tokens = 0;
  std::size_t kv_bytes_per_token = 0;
  std::size_t kv_budget_bytes = 0;
  // K/V bytes the blocks in use (running or cached) hold: with sliding windows, less than their
  // blocks' whole size once local layers' KV behind every window is given up (release_window_kv).
  std::size_t kv_bytes_in_use = 0;
  std::size_t ctx_size = 0;
  std::uint64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // prompt tokens looked up / found
  std::uint64_t tokens_computed = 0, tokens_reused = 0;
  std::uint64_t prompt_tokens = 0, generation_tokens = 0;
  std::uint64_t preemptions = 0, evicted_blocks = 0, steps = 0;
  std::uint64_t steps_interrupted = 0;  // steps stopped early for a follow-up (Scheduler::gives_way)
  std::uint64_t spool_hit_blocks = 0, spool_hit_tokens = 0;  // read back from the KV spool for requests
  // Tokens a device sampled itself (only the token came back, not its row of logits).
  std::uint64_t device_sampled_tokens = 0;
  // The step cost model's coefficients now (StepCostModel) and the step time limit they serve
  // (0: none, no ITL target).
  double step_fixed_ms = 0, step_per_token_ms = 0, step_per_1k_attended_ms = 0, step_limit_ms = 0;
  std::uint64_t finished[6] = {};  // by FinishReason
  // Speculative decoding (vLLM's spec_decode counters): verification rounds with guesses, guesses,
  // accepted guesses, and accepted guesses by their position in the chain.
  std::uint64_t spec_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;
  std::vector<std::uint64_t> spec_accepted_per_pos;
  // Blocks in use by running requests as a fraction of the pool (what vLLM calls kv_cache_usage).
  double kv_usage() const { return kv_blocks_total ? static_cast<double>(kv_blocks_used) / kv_blocks_total : 0.0; }
};

class Engine {
 public:
  // `tokenizer` may be null (token ids only: no text, no stop strings, no end-of-generation ids).
  Engine(const Model& model, const Tokenizer* tokenizer, EngineOptions options);
  ~Engine();  // cancels whatever is still in flight (each gets its finished event)
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request and returns its id. Throws Error for requests that can never run (no tokens,
  // a prompt longer than the context or than the whole KV budget, token ids outside the vocabulary).
  std::uint64_t submit(Request request);
  // Ends the request as "cancelled" at the next step boundary, freeing its KV references. False
  // when it is unknown or already finished.
  bool cancel(std::uint64_t id);
  EngineStats stats() const;
  const EngineOptions& options() const { return options_; }
  std::size_t ctx_size() const { return ctx_; }
  // Threads that compute a step (the pool's, the step loop's own included).
  std::size_t compute_threads() const { return static_cast<std::size_t>(pool_.size()); }
  // Time the step loop spends computing batches (not waiting for work): see BusyMeter.
  const BusyMeter& busy() const { return busy_; }
  // The KV spool, or null without --kv-spool (its stats are thread-safe).
  const KvSpool* spool() const { return spool_.get(); }
  // Receives, on the engine thread, how long each request waited for its spooled blocks.
  void set_spool_read_observer(std::function<void(double seconds)> observer);
  // Waits until the spool's queued writes are on disk or `deadline` passes (graceful shutdown).
  bool flush_spool(std::chrono::steady_clock::time_point deadline);

 private:
  void loop();
  void step();
  StepBudget step_budget() const;
  // Whether a request submitted since `plan` was made should have the step stop (on this thread).
  // `judged`: how many of the inbox's requests earlier calls for this step already turned down.
  bool newcomer_preempts(const StepPlan& plan, std::size_t& judged) const;
  // A sequence's next token from its logits row: the sampler and the log-probabilities. Touches
  // only that sequence and its row, so the step runs the picks of its sequences in parallel.
  struct Pick {
    std::int32_t id = 0;
    float logprob = 0.0f;
    std::vector<TokenLogprob> top;
  };
  Pick pick(Sequence& s, float* logits) const;
  // Whether s's next token may be drawn by the device that runs the model (backend/device_draw.h):
  // not where the host's pick does more than the device's sampler (logit bias, a grammar's mask,
  // log-probabilities, penalties) or verifies guesses.
  bool draws_on_device(const Sequence& s, const spec::Proposal& guesses) const;
  // Then, one sequence after another: the token joins the sequence and goes out as an event.
  // Returns false once the sequence has finished (it is gone then).
  bool accept(Sequence& s, Pick pick);
  // Guesses for the step's decoding streams where speculation applies; rebuilds plan.batch with
  // them after each stream's token. Returns each chunk's first logits row.
  std::vector<std::size_t> add_guesses(StepPlan& plan);
  spec::Proposer* proposer_for(Sequence& s);
  // Streams the token's text; true when it completed a stop string.
  bool emit_token(Sequence& s, std::int32_t id, float logprob, std::vector<TokenLogprob> top);
  void finish(Sequence& s, FinishReason reason, const std::string& error = {});
  void publish_stats();
  // Events are queued during a step and delivered after its stats are published.
  void deliver_later(const Sequence& s, EngineEvent e);
  void deliver_events();

  const Model& model_;
  const Tokenizer* tokenizer_;
  EngineOptions options_;
  std::size_t ctx_;
  std::vector<std::int32_t> eog_ids_;
  ThreadPool pool_;
  KvCache cache_;
  // After the cache (its reader thread fills pool blocks: joined before the pool goes) and before
  // the scheduler (which holds reads in flight).
  std::unique_ptr<KvSpool> spool_;
  std::function<void(double)> spool_read_observer_;  // guarded by mutex_
  StepCostModel cost_;  // calibrated before the first step, then refined by every step's time
  StepOverrun overrun_;
  Scheduler scheduler_;
  std::vector<float> logits_;
  backend::DeviceSampling device_sampling_;
  std::vector<std::pair<std::shared_ptr<const EventCallback>, EngineEvent>> pending_events_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Sequence>> inbox_;
  std::vector<std::uint64_t> cancels_;
  std::vector<std::uint64_t> live_;  // submitted and not yet finished
  bool stopping_ = false;
  std::uint64_t next_id_ = 1;
  EngineStats stats_;
  std::uint64_t finished_[6] = {};
  std::uint64_t prompt_tokens_ = 0, generation_tokens_ = 0, steps_ = 0, steps_interrupted_ = 0, device_sampled_tokens_ = 0;
  // Speculation: the n-gram proposer (stateless, shared), draft proposers per stream, this step's
  // guesses per chunk, and the counters.
  std::unique_ptr<spec::Proposer> ngram_;
  std::unordered_map<std::uint64_t, std::unique_ptr<spec::Proposer>> drafts_;
  std::vector<spec::Proposal> guesses_;
  std::vector<float> spec_p_;
  std::uint64_t spec_drafts_ = 0, spec_draft_tokens_ = 0, spec_accepted_tokens_ = 0;
  // Constrained streams' next masks, computed while the forward pass runs. Declared after the
  // sequences' owners: its thread is joined before any sequence is destroyed.
  mutable grammar::MaskWorker mask_worker_;
  std::vector<std::uint64_t> spec_accepted_per_pos_;
  BusyMeter busy_;
  std::thread thread_;
};

// "4GiB", "512MiB", "300MB", "1e9", or "25%" (of the memory available now). Throws Error otherwise.
std::size_t parse_memory_size(const std::string& text);
// A disk size: as parse_memory_size, or "10%" of the file system that holds `dir`.
std::uint64_t parse_disk_size(const std::string& text, const std::string& dir);

}  // namespace promptly
