#pragma once
// Decides what each engine step computes, and owns the KV memory that makes it possible.
//
// A step is one ragged batch within a budget (StepBudget: tokens and, with a cost model, predicted
// seconds): every DECODING request contributes its next token, then PREFILLING requests contribute
// chunks of what they have left, cut to the time left (chunked prefill: a long prompt streams in
// over several steps instead of stalling everyone's next token). WAITING requests are admitted
// highest priority first, then earliest arrival. Prompts get their chunks by priority, then either
// by arrival or (SchedulerOptions::shortest_first) short prompts first and shortest remaining first
// with aging (prefill_order). Optionally (SchedulerOptions::short_prompt_first) short prompts of the
// top priority get their tokens before long prompts' chunks, and a step that finishes a short
// prompt runs that prompt alone; the decode tokens and other prompts' chunks go in the next step.
//
// Memory: requests start from the longest cached prefix of their tokens (PrefixTree), and every
// block a request fills is offered to the tree at once, so a request that shares a prefix with one
// still prefilling waits for that block instead of computing it a second time. When the pool runs
// dry: evict cached blocks (least recently used first), then preempt the lowest-ranked running
// request (its blocks go to the cache, it goes back to WAITING and is recomputed later), and never
// drop a request silently.
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/request.h"
#include "engine/step_cost.h"
#include "kv/kv_cache.h"
#include "kv/prefix_tree.h"
#include "kv/spool.h"
#include "model/batch.h"
#include "grammar/mask_worker.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace promptly {

// One request inside the engine.
struct Sequence {
  std::uint64_t id = 0;
  int seq_id = 0;           // its KV cache sequence
  std::uint64_t order = 0;  // arrival order
  Request request;
  RequestState state = RequestState::Waiting;
  std::vector<std::int32_t> tokens;  // prompt, then every generated token
  std::size_t n_prompt = 0;
  std::size_t n_computed = 0;        // leading tokens whose K/V are in the cache
  std::size_t max_new = 0;           // generation limit (max_tokens and the context)
  std::size_t n_generated = 0;
  std::size_t inserted_blocks = 0;   // full blocks already offered to the prefix tree
  bool prompt_done = false;          // the prompt's first pass is over (cached_tokens is final)
  bool in_batch = false;             // part of the step being planned
  SteadyClock::time_point last_chunk;  // when its latest prompt chunk was planned (aging)
  SteadyClock::time_point deadline = SteadyClock::time_point::max();
  RequestTimes times;
  RequestUsage usage;
  // Generation state (the engine's side).
  std::shared_ptr<const EventCallback> callback;  // shared with events queued for delivery
  Sampler sampler;
  std::unique_ptr<StreamingDetokenizer> detokenizer;
  std::string held_text;  // decoded but not yet shown: it may be the start of a stop string
  std::unique_ptr<grammar::ConstrainedStream> constraint;  // when the request has a grammar
  // Chain hashes (kv/spool.h) of the first chain.size() full blocks of `tokens`.
  std::vector<ChainHash> chain;
  // Waiting for spooled blocks of its prompt to be read back: the RAM-cached blocks before them,
  // held so that they stay, and the spooled blocks awaited (Scheduler::reads_), from block
  // `first_block` on.
  struct SpoolWait {
    std::vector<int> held;
    std::vector<ChainHash> awaited;
    std::size_t first_block = 0;
    SteadyClock::time_point since;
  };
  std::unique_ptr<SpoolWait> spool_wait;

  Sequence(std::uint64_t id, std::uint64_t order, Request r);
  // Priority first (higher earlier), then arrival.
  bool ranks_before(const Sequence& other) const {
    return request.priority != other.request.priority ? request.priority > other.request.priority : order < other.order;
  }
  std::size_t pending() const { return tokens.size() - n_computed; }
};

struct SchedulerOptions {
  std::size_t max_running = 32;  // sequences in flight at once
  bool prefix_cache = true;
  // > 0: a step that finishes a prompt with at most this many tokens left runs it alone, leaving the
  // decoding sequences' tokens and other prompts' chunks to the next step (see
  // Scheduler::isolate_short_prompt).
  std::size_t short_prompt_first = 0;
  // Prompts get their chunks shortest remaining prefill first (within a priority), short prompts
  // before long ones, with aging, instead of by arrival: see Scheduler::prefill_order.
  bool shortest_first = false;
  // shortest_first: prompts with at most this many tokens left to compute (a chat's follow-up over
  // its cached history, a short new question) go before longer ones, whatever the longer ones' age.
  std::size_t short_prompt_tokens = 256;
  // shortest_first: among prompts of a kind, one that has waited t seconds ranks as if it were
  // shorter by the tokens this many times t seconds of prefill computes (from the step budget's cost
  // model; no aging without one).
  double aging = 0.25;
  // shortest_first: when the best long prompt has had no chunk for this long (short prompts took
  // every step), it goes before them for a step, so that a stream of short prompts cannot stall it.
  double starvation_s = 2.0;
};

// What one step may hold: at most `max_tokens` tokens and, with a cost model, at most `max_seconds`
// of predicted forward-pass time (0: no time limit). Every decoding sequence's token always goes in;
// the prompts' chunks get whatever fits, and never less than the decode tokens' own time (a step
// crowded with streams still moves a long prompt at half speed or better), and a step with nothing
// else in it computes at least one token.
struct StepBudget {
  std::size_t max_tokens = 512;
  double max_seconds = 0;
  const StepCostModel* cost = nullptr;
};

struct SchedulerCounters {
  std::uint64_t prefix_queries = 0;       // prompt tokens looked up in the prefix cache
  std::uint64_t prefix_hits = 0;          // of those, tokens found
  std::uint64_t tokens_computed = 0;      // tokens run through the model
  std::uint64_t tokens_reused = 0;        // tokens taken from the cache instead (incl. after preemption)
  std::uint64_t preemptions = 0;
  std::uint64_t evicted_blocks = 0;
  std::uint64_t spool_hit_blocks = 0;     // blocks read back from the spool for a request
  std::uint64_t spool_hit_tokens = 0;
};

struct StepPlan {
  Batch batch;
  struct Chunk {
    Sequence* seq;
    std::size_t n_tokens;
    bool sample;  // the chunk ends the sequence's pending tokens: its logits pick the next token
  };
  std::vector<Chunk> chunks;  // in batch order; those with `sample` own one logits row each, in order
  std::size_t n_decode = 0;   // sequences contributing a single decode token
  // The step may stop early for a short prompt that arrives while it runs (Scheduler::gives_way).
  bool may_give_way = false;
  int top_priority = 0;       // the highest priority among the chunks' requests
};

class Scheduler {
 public:
  Scheduler(KvCache& cache, SchedulerOptions options);
  ~Scheduler();

  // The prefix cache's disk tier (may be null): full blocks are written to it as they are offered
  // to the prefix tree, and a request whose prompt goes on into spooled blocks waits in the queue
  // while they are read back into the pool, then is admitted as a RAM hit.
  void set_spool(KvSpool* spool) { spool_ = spool; }
  // Seconds each request waited for its spooled blocks since the last call.
  std::vector<double> take_spool_read_waits() { return std::move(spool_read_waits_); }

  void add(std::unique_ptr<Sequence> seq);
  Sequence* find(std::uint64_t id);
  // Takes the sequence out (waiting or running), its full blocks going to the prefix cache.
  std::unique_ptr<Sequence> remove(Sequence* seq);
  // Sequences the scheduler itself had to end (no memory even alone), with finish reason set.
  std::vector<std::pair<std::unique_ptr<Sequence>, FinishReason>> take_ended();

  // Builds the next batch within `budget` (see the file comment).
  StepPlan plan(const StepBudget& budget);
  StepPlan plan(std::size_t max_tokens) { return plan(StepBudget{max_tokens}); }
  // After the forward pass: advances the chunks' sequences and offers their new full blocks.
  void commit(const StepPlan& plan);
  // Whether the step of `plan`, already running, should stop for `newcomer` (submitted, not yet
  // added), so that the next plan runs the newcomer alone. A follow-up turn arriving during a step
  // of other users' decode tokens (tens of ms) or of a long prompt's chunk (seconds) otherwise waits
  // for the rest of it; those users lose the part already run instead. Only for a short prompt over
  // what the prefix cache holds (a chat's follow-up), of a priority no lower than any in the step,
  // that the next plan will admit (a free running slot, no one waiting ahead of it),
  // and only for a step that finishes no prompt (no one's first token waits on it) and that follows
  // no step that gave way (isolated or stopped): the others wait at most every other step.
  bool gives_way(const StepPlan& plan, const Sequence& newcomer) const;
  // The forward pass of `plan` stopped early: nothing is committed, the next plan starts over from
  // the same state.
  void interrupted();
  // Speculation: room for a decoding sequence's guesses, from free blocks only (guesses never evict
  // cached prefixes or preempt anyone); and one accepted guess, whose K/V the step computed.
  bool reserve_guesses(Sequence& s, std::size_t n_positions);
  void accept_guess(Sequence& s);

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  const std::vector<std::unique_ptr<Sequence>>& running() const { return running_; }
  const std::vector<std::unique_ptr<Sequence>>& waiting() const { return waiting_; }
  std::vector<Sequence*> all() const;

  const SchedulerCounters& counters() const { return counters_; }
  std::size_t cached_blocks() const { return tree_.cached_blocks(); }
  std::size_t evictable_blocks() const { return tree_.evictable_blocks(); }
  KvCache& cache() { return cache_; }

 private:
  bool ensure_blocks(Sequence& s, std::size_t n_positions);
  void preempt(Sequence& s);
  void release_kv(Sequence& s);
  void offer_blocks(Sequence& s);
  void extend_from_cache(Sequence& s);
  bool waits_for_leader(const Sequence& s) const;
  bool admit(Sequence& s);
  // The room left in the step being planned.
  struct Room {
    std::size_t tokens_left;
    double seconds = 0;  // > 0: the predicted time the step may take
    const StepCostModel* cost = nullptr;
    double tokens = 0, attended = 0;  // what the step holds so far, in the cost model's terms
    void add(std::size_t start, std::size_t n);
  };
  void schedule_prefill(Sequence& s, Room& room, StepPlan& plan);
  // The prefilling sequences in the order their chunks are scheduled.
  std::vector<Sequence*> prefill_order(const StepBudget& budget) const;
  void isolate_short_prompt(StepPlan& plan);
  void end(Sequence& s, FinishReason reason);
  const std::vector<ChainHash>& chain_of(Sequence& s, std::size_t n_blocks);
  void start_spool_reads(Sequence& s);
  // Takes in the reads that are done: each waiting sequence whose blocks have all arrived has them
  // inserted into the prefix tree (up to the first that failed) and is admissible again.
  void settle_spool_reads();
  void abandon_spool_wait(Sequence& s);

  KvCache& cache_;
  PrefixTree tree_;
  SchedulerOptions options_;
  SchedulerCounters counters_;
  std::vector<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // in rank order after each plan
  std::vector<std::pair<std::unique_ptr<Sequence>, FinishReason>> ended_;
  bool isolated_last_ = false;     // the last plan ran a short prompt alone
  bool interrupted_last_ = false;  // the last plan's step stopped early (gives_way)
  KvSpool* spool_ = nullptr;
  // Spooled blocks being read, by chain hash: each into a pool block held here, awaited by
  // `waiters` sequences, so that requests sharing a spooled prefix read it once.
  struct PendingRead {
    int block = -1;
    std::shared_ptr<const KvSpool::Read> read;
    int waiters = 0;
  };
  std::unordered_map<ChainHash, PendingRead> reads_;
  std::vector<double> spool_read_waits_;
};

}  // namespace promptly
