#include "engine/scheduler.h"

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "util/error.h"

namespace promptly {

Sequence::Sequence(std::uint64_t id_, std::uint64_t order_, Request r)
    : id(id_), seq_id(static_cast<int>(id_ & 0x7fffffff)), order(order_), request(std::move(r)), sampler(request.sampling) {
  tokens = request.prompt;
  n_prompt = tokens.size();
}

Scheduler::Scheduler(KvCache& cache, SchedulerOptions options) : cache_(cache), tree_(cache.pool(), cache.window()), options_(options) {}

Scheduler::~Scheduler() {
  for (auto& s : running_) cache_.erase(s->seq_id);
}

void Scheduler::add(std::unique_ptr<Sequence> seq) {
  seq->state = RequestState::Waiting;
  start_spool_reads(*seq);
  waiting_.push_back(std::move(seq));
}

const std::vector<ChainHash>& Scheduler::chain_of(Sequence& s, std::size_t n_blocks) {
  extend_chain(s.chain, s.tokens, cache_.block_tokens(), n_blocks);
  return s.chain;
}

// Why reads start here (the request's arrival) and not at admission: the read of a long spooled
// prefix (tens of MB) then overlaps the steps that run before the request's turn, and the request
// is admitted as a plain RAM hit once its blocks are in.
void Scheduler::start_spool_reads(Sequence& s) {
  if (!spool_ || !options_.prefix_cache || s.spool_wait || s.tokens.size() < 2) return;
  const std::size_t bt = cache_.block_tokens();
  const std::size_t n_full = (s.tokens.size() - 1) / bt;  // the last token is always computed
  if (n_full == 0) return;
  const auto tokens = std::span<const std::int32_t>(s.tokens);
  const std::size_t ram = tree_.cached_length(tokens.first(n_full * bt)) / bt;
  if (ram >= n_full) return;
  const std::vector<ChainHash>& chain = chain_of(s, n_full);
  // Blocks being read for other requests are in the spool's index too (a failed read drops its
  // block, which ends the run there).
  const std::size_t n = spool_->present_run(chain, ram);
  if (n == 0) return;
  auto wait = std::make_unique<Sequence::SpoolWait>();
  tree_.match(s.tokens, wait->held, ram * bt, /*count=*/false);
  wait->first_block = ram;
  wait->since = SteadyClock::now();
  BlockPool& pool = cache_.pool();
  for (std::size_t i = ram; i < ram + n; ++i) {
    const ChainHash h = chain[i];
    if (auto it = reads_.find(h); it != reads_.end()) {
      ++it->second.waiters;
      wait->awaited.push_back(h);
      continue;
    }
    // A block the request's first computed query (at the run's end) sees past takes no local
    // segment: its sliding-window layers' part of the file is skipped.
    const bool behind = cache_.window() > 0 && (i + 1) * bt + cache_.window() <= (ram + n) * bt + 1;
    const auto allocate = [&] { return behind ? pool.allocate_without_local() : pool.allocate(); };
    int block = allocate();
    if (block < 0 && pool.n_free() == 0 && tree_.evict(1) > 0) {  // evicting helps only where blocks ran out
      ++counters_.evicted_blocks;
      block = allocate();
    }
    if (block < 0) break;  // no room now: the rest is recomputed
    auto read = read_spooled_block(*spool_, cache_, block, h, i * bt, tokens.subspan(i * bt, bt), /*skip_missing=*/behind);
    reads_.emplace(h, PendingRead{block, std::move(read), 1});
    wait->awaited.push_back(h);
  }
  if (wait->awaited.empty()) {
    for (int b : wait->held) pool.release(b);
    return;
  }
  s.spool_wait = std::move(wait);
}

void Scheduler::abandon_spool_wait(Sequence& s) {
  if (!s.spool_wait) return;
  for (int b : s.spool_wait->held) cache_.pool().release(b);
  for (ChainHash h : s.spool_wait->awaited) --reads_.at(h).waiters;
  s.spool_wait.reset();
}

void Scheduler::settle_spool_reads() {
  if (reads_.empty()) return;
  const std::size_t bt = cache_.block_tokens();
  for (auto& seq : waiting_) {
    Sequence& s = *seq;
    if (!s.spool_wait) continue;
    Sequence::SpoolWait& w = *s.spool_wait;
    const bool all_done = std::all_of(w.awaited.begin(), w.awaited.end(),
                                      [&](ChainHash h) { return reads_.at(h).read->done.load(std::memory_order_acquire); });
    if (!all_done) continue;
    std::vector<int> blocks = w.held;
    std::size_t arrived = 0;
    for (ChainHash h : w.awaited) {
      const PendingRead& r = reads_.at(h);
      if (!r.read->ok) break;  // what follows a block that failed has no parent: recomputed
      blocks.push_back(r.block);
      ++arrived;
    }
    if (arrived > 0) {
      tree_.insert(std::span<const std::int32_t>(s.tokens).first((w.first_block + arrived) * bt), blocks);
      counters_.spool_hit_blocks += arrived;
      counters_.spool_hit_tokens += arrived * bt;
    }
    spool_read_waits_.push_back(std::chrono::duration<double>(SteadyClock::now() - w.since).count());
    abandon_spool_wait(s);
  }
  for (auto it = reads_.begin(); it != reads_.end();) {
    if (it->second.waiters <= 0 && it->second.read->done.load(std::memory_order_acquire)) {
      cache_.pool().release(it->second.block);
      it = reads_.erase(it);
    } else {
      ++it;
    }
  }
}

Sequence* Scheduler::find(std::uint64_t id) {
  for (auto& s : running_) if (s->id == id) return s.get();
  for (auto& s : waiting_) if (s->id == id) return s.get();
  return nullptr;
}

std::vector<Sequence*> Scheduler::all() const {
  std::vector<Sequence*> v;
  for (auto& s : running_) v.push_back(s.get());
  for (auto& s : waiting_) v.push_back(s.get());
  return v;
}

namespace {
std::unique_ptr<Sequence> take(std::vector<std::unique_ptr<Sequence>>& from, Sequence* s) {
  auto it = std::find_if(from.begin(), from.end(), [&](const auto& p) { return p.get() == s; });
  if (it == from.end()) return nullptr;
  std::unique_ptr<Sequence> owned = std::move(*it);
  from.erase(it);
  return owned;
}
}  // namespace

std::unique_ptr<Sequence> Scheduler::remove(Sequence* s) {
  if (auto owned = take(running_, s)) {
    release_kv(*owned);
    return owned;
  }
  abandon_spool_wait(*s);
  return take(waiting_, s);
}

std::vector<std::pair<std::unique_ptr<Sequence>, FinishReason>> Scheduler::take_ended() { return std::move(ended_); }

void Scheduler::offer_blocks(Sequence& s) {
  if (!options_.prefix_cache) return;
  const std::size_t bt = cache_.block_tokens();
  const std::size_t full = s.n_computed / bt;
  if (full <= s.inserted_blocks) return;
  if (spool_) {
    // Full blocks are final: spooled now (a copy, written behind), so evicting them later is free.
    const std::vector<ChainHash>& chain = chain_of(s, full);
    const std::vector<int>& blocks = cache_.blocks(s.seq_id);
    for (std::size_t i = s.inserted_blocks; i < full; ++i) {
      spool_block(*spool_, cache_, blocks[i], chain[i], i == 0 ? 0 : chain[i - 1], i * bt, std::span<const std::int32_t>(s.tokens).subspan(i * bt, bt));
    }
  }
  tree_.insert(std::span<const std::int32_t>(s.tokens).first(full * cache_.block_tokens()), cache_.blocks(s.seq_id));
  s.inserted_blocks = full;
}

void Scheduler::release_kv(Sequence& s) {
  offer_blocks(s);  // what it computed stays cached for a follow-up turn or its own resumption
  const std::size_t bt = cache_.block_tokens(), full = s.n_computed / bt;
  if (options_.prefix_cache && s.n_computed % bt != 0 && cache_.blocks(s.seq_id).size() > full) {
    tree_.insert_partial(std::span<const std::int32_t>(s.tokens).first(s.n_computed), cache_.blocks(s.seq_id)[full]);
  }
  cache_.erase(s.seq_id);
  s.n_computed = 0;
  s.inserted_blocks = 0;
}

void Scheduler::preempt(Sequence& s) {
  release_kv(s);
  s.state = RequestState::Preempted;
  s.times.preempted = SteadyClock::now();
  ++s.usage.preemptions;
  ++counters_.preemptions;
  s.state = RequestState::Waiting;  // recomputed from the cache when memory allows
  if (auto owned = take(running_, &s)) waiting_.push_back(std::move(owned));
  start_spool_reads(s);
}

void Scheduler::end(Sequence& s, FinishReason reason) {
  if (auto owned = take(running_, &s)) {
    release_kv(*owned);
    ended_.emplace_back(std::move(owned), reason);
  }
}

bool Scheduler::ensure_blocks(Sequence& s, std::size_t n_positions) {
  const std::size_t bt = cache_.block_tokens();
  for (;;) {
    if (cache_.try_reserve(s.seq_id, n_positions)) return true;
    const std::size_t missing = (n_positions + bt - 1) / bt - cache_.blocks(s.seq_id).size();
    // Out of sliding-window segments rather than blocks: cached blocks hold none whole, so evicting
    // them frees none; only sequences moving on or stepping aside do.
    if (const std::size_t freed = cache_.pool().out_of_segments() ? 0 : tree_.evict(missing)) {
      counters_.evicted_blocks += freed;
      continue;
    }
    // The lowest-ranked running sequence below `s` that is not already part of this step.
    Sequence* victim = nullptr;
    for (auto& r : running_) {
      if (r.get() == &s || r->in_batch || !s.ranks_before(*r)) continue;
      if (!victim || victim->ranks_before(*r)) victim = r.get();
    }
    if (victim) {
      preempt(*victim);
      continue;
    }
    const bool alone = std::all_of(running_.begin(), running_.end(),
                                   [&](const auto& r) { return r.get() == &s || cache_.blocks(r->seq_id).empty(); });
    if (alone) {
      // Nothing else holds memory: the sequence has outgrown the whole KV budget.
      end(s, FinishReason::Length);
    } else if (s.state == RequestState::Decoding) {
      preempt(s);  // outranked by everyone holding memory: step aside, resume when they finish
    }
    // A prefilling sequence keeps its blocks and retries next step.
    return false;
  }
}

void Scheduler::extend_from_cache(Sequence& s) {
  if (!options_.prefix_cache) return;
  const std::size_t bt = cache_.block_tokens();
  if (s.n_computed % bt != 0 || cache_.blocks(s.seq_id).size() != s.n_computed / bt) return;
  std::vector<int> blocks;
  // At least the last token is always computed: its logits pick the next token.
  const std::size_t matched = tree_.match(s.tokens, blocks, s.tokens.size() - 1, /*count=*/false);
  const std::size_t have = s.n_computed / bt;
  for (std::size_t i = 0; i < std::min(have, blocks.size()); ++i) cache_.pool().release(blocks[i]);
  if (matched <= s.n_computed) {
    for (std::size_t i = have; i < blocks.size(); ++i) cache_.pool().release(blocks[i]);
    return;
  }
  const std::vector<int> extra(blocks.begin() + static_cast<long>(have), blocks.end());
  cache_.adopt(s.seq_id, extra, matched);
  counters_.tokens_reused += matched - s.n_computed;
  if (!s.prompt_done) {
    const std::size_t gained = std::min(matched, s.n_prompt) - std::min(s.n_computed, s.n_prompt);
    s.usage.cached_tokens += gained;
    counters_.prefix_hits += gained;
  }
  s.n_computed = matched;
  s.inserted_blocks = matched / bt;
}

bool Scheduler::waits_for_leader(const Sequence& s) const {
  if (!options_.prefix_cache) return false;
  const std::size_t bt = cache_.block_tokens();
  const std::size_t n = s.n_computed, next_end = n + bt;
  if (n % bt != 0 || next_end > s.tokens.size() - 1) return false;
  for (const auto& l : running_) {
    if (l.get() == &s || l->state != RequestState::Prefilling) continue;
    const bool ahead = l->n_computed > n || (l->n_computed == n && l->ranks_before(s));
    if (!ahead || l->n_computed >= next_end || l->tokens.size() < next_end) continue;
    if (std::equal(s.tokens.begin(), s.tokens.begin() + static_cast<long>(next_end), l->tokens.begin())) return true;
  }
  return false;
}

bool Scheduler::admit(Sequence& s) {
  const std::size_t bt = cache_.block_tokens();
  std::vector<int> blocks;
  std::size_t matched = 0;
  if (options_.prefix_cache) matched = tree_.match(s.tokens, blocks, s.tokens.size() - 1, /*count=*/false);
  const std::size_t needed = (s.tokens.size() + 1 + bt - 1) / bt - blocks.size();
  const std::size_t available = cache_.pool().n_free() + tree_.evictable_blocks();
  if (needed > available && !running_.empty()) {
    for (int b : blocks) cache_.pool().release(b);
    return false;  // wait for memory rather than thrash
  }
  cache_.adopt(s.seq_id, blocks, matched);
  s.n_computed = matched;
  s.inserted_blocks = matched / bt;
  counters_.tokens_reused += matched;
  if (s.times.scheduled == SteadyClock::time_point{}) {  // first admission: the prompt's cache lookup
    s.times.scheduled = SteadyClock::now();
    const std::size_t hit = std::min(matched, s.n_prompt);
    s.usage.cached_tokens = hit;
    counters_.prefix_queries += s.n_prompt;
    counters_.prefix_hits += hit;
  } else {
    s.times.resumed = SteadyClock::now();
  }
  s.state = RequestState::Prefilling;
  return true;
}

void Scheduler::Room::add(std::size_t start, std::size_t n) {
  tokens_left -= n;
  tokens += static_cast<double>(n);
  attended += StepCostModel::attended_by(start, n);
}

void Scheduler::schedule_prefill(Sequence& s, Room& room, StepPlan& plan) {
  extend_from_cache(s);
  if (room.tokens_left == 0 || waits_for_leader(s)) return;
  std::size_t chunk = std::min(room.tokens_left, s.pending());
  if (room.seconds > 0) {
    chunk = room.cost->tokens_within(room.seconds, room.tokens, room.attended, s.n_computed, chunk);
    if (chunk == 0) {
      if (!plan.chunks.empty()) {
        room.tokens_left = 0;  // the step's time is spent
        return;
      }
      chunk = 1;  // alone in its step: progress, whatever the prediction says
    }
  }
  if (!ensure_blocks(s, s.n_computed + chunk)) return;
  plan.chunks.push_back({&s, chunk, chunk == s.pending()});
  s.in_batch = true;
  s.last_chunk = SteadyClock::now();
  room.add(s.n_computed, chunk);
}

// Why shortest remaining first: when several prompts compete (a burst of requests behind one system
// prompt, cold conversations arriving together), advancing all of them in arrival order through
// shared steps finishes them all at the end; the one closest to its first token going first has
// them complete one after another, which lowers every percentile but the last (and the last gets
// its first token no later). Short prompts (a chat's follow-up over its cached history: tens to a
// couple of hundred new tokens) go before long ones as a class, so that a cold prompt that has
// waited long (and aged) still does not hold a follow-up for the seconds its prefill takes. Aging
// within a class (a prompt's wait counts as `aging` times that much of its prefill done) lets an
// old long prompt finish before newer long ones overtake it, and the starvation rule gives the
// best long prompt a step whenever short ones have taken every step for `starvation_s`.
std::vector<Sequence*> Scheduler::prefill_order(const StepBudget& budget) const {
  std::vector<Sequence*> order;
  for (const auto& s : running_) {
    if (s->state == RequestState::Prefilling) order.push_back(s.get());
  }
  if (!options_.shortest_first) {
    std::stable_sort(order.begin(), order.end(), [](const Sequence* a, const Sequence* b) { return a->ranks_before(*b); });
    return order;
  }
  const double tokens_per_waited_s = budget.cost ? options_.aging / budget.cost->per_token_s() : 0.0;
  const auto now = SteadyClock::now();
  auto seconds_since = [&](SteadyClock::time_point t) { return std::chrono::duration<double>(now - t).count(); };
  struct Keyed {
    Sequence* seq;
    bool is_short;
    double key;
  };
  std::vector<Keyed> keyed;
  for (Sequence* s : order) {
    keyed.push_back({s, s->pending() <= options_.short_prompt_tokens,
                     static_cast<double>(s->pending()) - tokens_per_waited_s * seconds_since(s->times.arrival)});
  }
  auto before = [](const Keyed& a, const Keyed& b) {
    if (a.seq->request.priority != b.seq->request.priority) return a.seq->request.priority > b.seq->request.priority;
    if (a.is_short != b.is_short) return a.is_short;
    if (a.key != b.key) return a.key < b.key;
    return a.seq->order < b.seq->order;
  };
  std::stable_sort(keyed.begin(), keyed.end(), before);
  const auto best_long = std::find_if(keyed.begin(), keyed.end(), [](const Keyed& k) { return !k.is_short; });
  if (best_long != keyed.end() &&
      seconds_since(std::max(best_long->seq->times.arrival, best_long->seq->last_chunk)) > options_.starvation_s) {
    // Ahead of the short prompts of its priority, not of anyone of a higher one.
    const auto first_short = std::find_if(keyed.begin(), best_long, [&](const Keyed& k) {
      return k.seq->request.priority == best_long->seq->request.priority;
    });
    std::rotate(first_short, best_long, best_long + 1);
  }
  for (std::size_t i = 0; i < keyed.size(); ++i) order[i] = keyed[i].seq;
  return order;
}

// Why: a chat's follow-up turn over a cached history computes only its new tokens (tens), so its
// time to first token is one step, and that step is compute-bound: tens of tokens through every
// weight, each with attention over a long history. Anything else in it adds to that time. The
// decoding streams' tokens add their attention over long contexts and their share of the matrix
// products (multiturn bench, 8 conversations near 2000 tokens: ~25 ms of a ~300 ms step); left out,
// each stream waits one more (decode-only, short) step, after the prompt's step it was waiting for
// anyway. Another prompt's tokens cost about as much as the prompt's own: two follow-ups in one step
// both wait for both, while one after the other the first waits half as long and the second as
// long as before. So the step runs the best-ranked such prompt alone. Never two such plans in a
// row, so that prompts arriving back to back cannot starve the decoders or a long prompt, and never
// when a sequence in the plan ranks above the prompt by priority.
void Scheduler::isolate_short_prompt(StepPlan& plan) {
  const bool isolated_last = std::exchange(isolated_last_, false);
  if (options_.short_prompt_first == 0 || isolated_last || plan.chunks.size() < 2) return;
  Sequence* prompt = nullptr;
  for (const StepPlan::Chunk& c : plan.chunks) {
    if (c.seq->state == RequestState::Decoding || !c.sample || c.n_tokens > options_.short_prompt_first) continue;
    if (!prompt || c.seq->ranks_before(*prompt)) prompt = c.seq;
  }
  if (!prompt) return;
  for (const StepPlan::Chunk& c : plan.chunks) {
    if (c.seq->request.priority > prompt->request.priority) return;
  }
  std::erase_if(plan.chunks, [&](const StepPlan::Chunk& c) {
    if (c.seq == prompt) return false;
    c.seq->in_batch = false;  // a prompt left out keeps its state and blocks: it goes on next step
    return true;
  });
  plan.n_decode = 0;
  isolated_last_ = true;
}

StepPlan Scheduler::plan(const StepBudget& budget) {
  StepPlan plan;
  settle_spool_reads();
  const bool after_giving_way = isolated_last_ || std::exchange(interrupted_last_, false);
  auto by_rank = [](const auto& a, const auto& b) { return a->ranks_before(*b); };
  std::stable_sort(running_.begin(), running_.end(), by_rank);
  for (auto& s : running_) s->in_batch = false;

  // Snapshots: ensure_blocks may preempt or end sequences (moving them out of running_).
  std::vector<Sequence*> ranked;
  for (auto& s : running_) ranked.push_back(s.get());
  auto still_running = [&](Sequence* s) {
    return std::any_of(running_.begin(), running_.end(), [&](const auto& r) { return r.get() == s; });
  };

  Room room{budget.max_tokens, 0, budget.cost};
  for (Sequence* s : ranked) {  // every decoding sequence's next token first
    if (room.tokens_left == 0) break;
    if (!still_running(s) || s->state != RequestState::Decoding) continue;
    if (!ensure_blocks(*s, s->n_computed + 1)) continue;
    plan.chunks.push_back({s, 1, true});
    s->in_batch = true;
    ++plan.n_decode;
    room.add(s->n_computed, 1);
  }
  if (budget.max_seconds > 0 && budget.cost) {
    room.seconds = std::max(budget.max_seconds, 2 * budget.cost->predict(room.tokens, room.attended));
  }
  std::stable_sort(waiting_.begin(), waiting_.end(), by_rank);
  auto admit_waiting = [&](bool with_chunks) {
    for (std::size_t i = 0; room.tokens_left > 0 && i < waiting_.size() && running_.size() < options_.max_running;) {
      Sequence& s = *waiting_[i];
      if (s.spool_wait) {  // its spooled blocks are still being read: the next ones go ahead meanwhile
        ++i;
        continue;
      }
      if (!admit(s)) break;  // strict rank order: a big request is not overtaken forever by small ones
      running_.push_back(std::move(waiting_[i]));
      waiting_.erase(waiting_.begin() + static_cast<long>(i));
      if (with_chunks) schedule_prefill(s, room, plan);
    }
  };
  // With short prompts first, this step may run a short prompt alone (isolate_short_prompt), so
  // short prompts, new ones included, get their tokens before long prompts' chunks: a follow-up
  // arriving while a long prompt prefills would otherwise wait for every chunk of it. With shortest
  // first, new prompts compete with those already prefilling. Otherwise the prompts already being
  // prefilled go first and new ones are admitted with what budget is left.
  const bool short_first = options_.short_prompt_first > 0 && !isolated_last_;
  const bool admit_first = short_first || options_.shortest_first;
  if (admit_first) admit_waiting(false);
  const std::vector<Sequence*> prefilling = prefill_order(budget);
  // Never ahead of a prompt of higher priority.
  const int top_priority = prefilling.empty() ? 0 : prefilling.front()->request.priority;
  auto goes_first = [&](const Sequence* s) {
    return options_.shortest_first ||
           (short_first && s->pending() <= options_.short_prompt_first && s->request.priority == top_priority);
  };
  for (bool first_pass : {true, false}) {
    for (Sequence* s : prefilling) {
      if (room.tokens_left == 0) break;
      if (!still_running(s) || s->state != RequestState::Prefilling || s->in_batch) continue;
      if (first_pass == goes_first(s)) schedule_prefill(*s, room, plan);
    }
  }
  if (!admit_first) admit_waiting(true);
  isolate_short_prompt(plan);
  plan.may_give_way = options_.short_prompt_first > 0 && !after_giving_way && !isolated_last_ && !plan.chunks.empty() &&
                      std::none_of(plan.chunks.begin(), plan.chunks.end(),
                                   [](const StepPlan::Chunk& c) { return c.sample && c.seq->state != RequestState::Decoding; });
  if (!plan.chunks.empty()) {
    plan.top_priority = std::max_element(plan.chunks.begin(), plan.chunks.end(), [](const StepPlan::Chunk& a, const StepPlan::Chunk& b) {
                          return a.seq->request.priority < b.seq->request.priority;
                        })->seq->request.priority;
  }
  // The batch from the final chunks, in their order (which is the logits rows' order).
  for (const StepPlan::Chunk& c : plan.chunks) {
    for (std::size_t i = 0; i < c.n_tokens; ++i) {
      const std::size_t pos = c.seq->n_computed + i;
      plan.batch.add(c.seq->tokens[pos], static_cast<std::int32_t>(pos), c.seq->seq_id, c.sample && i + 1 == c.n_tokens);
    }
  }
  return plan;
}

bool Scheduler::gives_way(const StepPlan& plan, const Sequence& newcomer) const {
  if (!plan.may_give_way || newcomer.request.priority < plan.top_priority || newcomer.tokens.empty()) return false;
  // It must be admitted next: room to run, and no one waiting who ranks before it (same priority, earlier).
  if (running_.size() >= options_.max_running) return false;
  if (std::any_of(waiting_.begin(), waiting_.end(), [&](const auto& w) { return w->request.priority >= newcomer.request.priority; })) {
    return false;
  }
  // What admission's match will find: the prefix cache's rows for all but the last token (whose
  // logits must be computed).
  const auto reusable = std::span<const std::int32_t>(newcomer.tokens).first(newcomer.tokens.size() - 1);
  const std::size_t cached = options_.prefix_cache ? tree_.cached_length(reusable) : 0;
  return newcomer.tokens.size() - cached <= options_.short_prompt_first;
}

void Scheduler::interrupted() { interrupted_last_ = true; }

bool Scheduler::reserve_guesses(Sequence& s, std::size_t n_positions) { return cache_.try_reserve(s.seq_id, n_positions); }

void Scheduler::accept_guess(Sequence& s) {
  ++s.n_computed;
  ++counters_.tokens_computed;
  offer_blocks(s);
}

void Scheduler::commit(const StepPlan& plan) {
  for (const StepPlan::Chunk& c : plan.chunks) {
    c.seq->n_computed += c.n_tokens;
    counters_.tokens_computed += c.n_tokens;
    if (c.seq->n_computed >= c.seq->n_prompt) c.seq->prompt_done = true;
    offer_blocks(*c.seq);
    // Its next query is at n_computed (rejected guesses past it are overwritten).
    cache_.release_behind_window(c.seq->seq_id, c.seq->n_computed);
  }
}

}  // namespace promptly
