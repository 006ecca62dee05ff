// The serving engine on the real stories260K model: equivalence with single-sequence generation,
// batch equivalence, prefix reuse, memory pressure, cancellation, timeouts, priorities, stop strings.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "../test_util.h"
#include "convert/synthetic_model.h"
#include "engine/generate.h"
#include "gguf/gguf.h"
#include "grammar/compile.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/token_bytes_of.h"
#include "util/error.h"

namespace promptly {
namespace {

struct Loaded {
  std::shared_ptr<const gguf::File> file;
  Model model;
  Tokenizer tokenizer;
  Loaded() : file(gguf::File::open(test::shared_model("stories260K.gguf"))), model(file), tokenizer(Vocab::from_gguf(*file)) {}
};

const Loaded& stories() {
  static const Loaded m;
  return m;
}

// Gathers every request's events; wait() blocks until the given requests have finished.
class Collector {
 public:
  struct Result {
    std::vector<std::int32_t> tokens;
    std::string text;
    std::vector<SteadyClock::time_point> token_times;
    bool finished = false;
    EngineEvent end;
  };

  EventCallback callback() {
    return [this](const EngineEvent& e) {
      std::lock_guard lock(mutex_);
      Result& r = results_[e.request_id];
      EXPECT_FALSE(r.finished) << "event after the finish of request " << e.request_id;
      r.text += e.text;
      if (e.kind == EngineEvent::Kind::Token) {
        r.tokens.push_back(e.token);
        r.token_times.push_back(e.time);
      } else {
        r.finished = true;
        r.end = e;
        done_.notify_all();
      }
    };
  }

  Result wait(std::uint64_t id) {
    std::unique_lock lock(mutex_);
    const bool ok = done_.wait_for(lock, std::chrono::seconds(120), [&] { return results_[id].finished; });
    EXPECT_TRUE(ok) << "request " << id << " never finished";
    return results_[id];
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::map<std::uint64_t, Result> results_;
};

Request greedy_request(std::vector<std::int32_t> prompt, int max_tokens, Collector& c) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.on_event = c.callback();
  return r;
}

std::vector<std::int32_t> random_prompt(std::mt19937& rng, std::size_t n) {
  std::uniform_int_distribution<std::int32_t> tok(3, 511);  // stories260K's vocabulary is 512
  std::vector<std::int32_t> p = {1};
  while (p.size() < n) p.push_back(tok(rng));
  return p;
}

// The greedy continuation of `prompt` computed alone by single-sequence generation.
std::vector<std::int32_t> solo(const std::vector<std::int32_t>& prompt, int n, KvType kv) {
  ThreadPool pool(1);
  GenerateOptions o;
  o.max_tokens = n;
  o.sampling.temperature = 0;
  o.ignore_eos = true;
  o.kv_type = kv;
  return generate(stories().model, stories().tokenizer, prompt, o, pool).ids;
}

void expect_all_memory_released(const Engine& engine) {
  // The engine publishes stats after each step: give it a moment after the last finish.
  EngineStats st;
  for (int i = 0; i < 200; ++i) {
    st = engine.stats();
    if (st.running == 0 && st.waiting == 0 && st.kv_blocks_used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(st.running, 0u);
  EXPECT_EQ(st.waiting, 0u);
  EXPECT_EQ(st.kv_blocks_used, 0u);
  EXPECT_EQ(st.kv_blocks_free + st.kv_blocks_cached, st.kv_blocks_total);
}

TEST(Engine, GreedyMatchesTheReferenceAndSingleSequenceGeneration) {
  EngineOptions o;
  o.kv_type = KvType::F32;
  o.threads = 2;
  Engine engine(stories().model, &stories().tokenizer, o);
  Collector c;
  const auto id = engine.submit(greedy_request({1}, 200, c));
  const auto r = c.wait(id);
  std::istringstream in(test::read_file(test::shared_model("testvectors/stories260K.greedy200.ids")));
  std::vector<std::int32_t> reference;
  for (std::int32_t t; in >> t;) reference.push_back(t);
  EXPECT_EQ(r.tokens, reference);
  EXPECT_EQ(r.text, test::read_file(test::shared_model("testvectors/stories260K.greedy200.txt")));
  EXPECT_EQ(r.end.finish_reason, FinishReason::Length);
  EXPECT_EQ(r.end.usage.prompt_tokens, 1u);
  EXPECT_EQ(r.end.usage.completion_tokens, 200u);
  // The stamps are the metrics: they must be ordered.
  const RequestTimes& t = r.end.times;
  EXPECT_LE(t.arrival, t.scheduled);
  EXPECT_LE(t.scheduled, t.first_token);
  EXPECT_LE(t.first_token, t.last_token);
  EXPECT_LE(t.last_token, t.finished);
  EXPECT_TRUE(std::is_sorted(r.token_times.begin(), r.token_times.end()));
  expect_all_memory_released(engine);
}

// With greedy sampling a request's tokens do not depend on what it is batched with, nor on the
// chunk size: every mix of prompt lengths and budgets gives each request its solo output.
TEST(Engine, BatchEquivalenceAcrossRandomMixesAndChunkSizes) {
  std::mt19937 rng(7);
  for (int round = 0; round < 6; ++round) {
    EngineOptions o;
    o.kv_type = round % 2 ? KvType::F16 : KvType::F32;
    o.max_batch_tokens = std::uniform_int_distribution<std::size_t>(1, 70)(rng);
    o.block_tokens = round < 3 ? 16 : 5;
    o.prefix_cache = round != 4;
    o.threads = 2;
    Engine engine(stories().model, &stories().tokenizer, o);
    Collector c;
    std::vector<std::pair<std::uint64_t, std::vector<std::int32_t>>> submitted;
    const int n = std::uniform_int_distribution<int>(3, 8)(rng);
    const auto shared = random_prompt(rng, 40);
    for (int i = 0; i < n; ++i) {
      auto prompt = random_prompt(rng, std::uniform_int_distribution<std::size_t>(1, 90)(rng));
      if (i % 3 == 1) prompt.insert(prompt.begin() + 1, shared.begin() + 1, shared.end());  // some share a prefix
      Request r = greedy_request(prompt, 24, c);
      r.ignore_eos = true;
      submitted.emplace_back(engine.submit(std::move(r)), prompt);
    }
    for (const auto& [id, prompt] : submitted) {
      const auto r = c.wait(id);
      EXPECT_EQ(r.tokens, solo(prompt, 24, o.kv_type))
          << "round " << round << ", prompt of " << prompt.size() << " tokens, budget " << o.max_batch_tokens;
      EXPECT_EQ(r.end.finish_reason, FinishReason::Length);
    }
    expect_all_memory_released(engine);
  }
}

// Follow-ups arriving while other users decode stop the step in flight (Scheduler::gives_way), and
// every output stays what it would be alone: the stopped step's tokens run again from the same state.
TEST(Engine, StepsStoppedForFollowUpsChangeNoOutput) {
  EngineOptions o;
  o.threads = 2;
  o.itl_target_ms = 0;  // steps stop for follow-ups only without an ITL target
  Engine engine(stories().model, &stories().tokenizer, o);
  Collector c;
  std::mt19937 rng(11);
  std::vector<std::pair<std::uint64_t, std::vector<std::int32_t>>> decoders, follow_ups;
  for (int i = 0; i < 8; ++i) {
    const auto prompt = random_prompt(rng, 30 + 10 * static_cast<std::size_t>(i));
    Request r = greedy_request(prompt, 400, c);
    r.ignore_eos = true;
    decoders.emplace_back(engine.submit(std::move(r)), prompt);
  }
  // Short prompts, one at a time at a random moment, until some step has given way. One at a time:
  // a step planned right after one that gave way never does, so arrivals at every step boundary
  // would keep every step from giving way.
  for (int i = 0; i < 200 && (i < 6 || engine.stats().steps_interrupted == 0); ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 3000)(rng)));
    const auto prompt = random_prompt(rng, std::uniform_int_distribution<std::size_t>(5, 40)(rng));
    Request r = greedy_request(prompt, 4, c);
    r.ignore_eos = true;
    const std::uint64_t id = engine.submit(std::move(r));
    c.wait(id);
    follow_ups.emplace_back(id, prompt);
  }
  EXPECT_GT(engine.stats().steps_interrupted, 0u);
  // The decoders had room for more than this needs; what each produced must be its solo output.
  for (const auto& [id, prompt] : decoders) engine.cancel(id);
  for (const auto* group : {&decoders, &follow_ups}) {
    for (const auto& [id, prompt] : *group) {
      const auto r = c.wait(id);
      EXPECT_EQ(r.tokens, solo(prompt, static_cast<int>(r.tokens.size()), KvType::F16)) << "prompt of " << prompt.size() << " tokens";
      EXPECT_NE(r.end.finish_reason, FinishReason::Error);
    }
  }
  expect_all_memory_released(engine);
}

TEST(Engine, FollowUpTurnComputesOnlyItsNewTokens) {
  EngineOptions o;
  o.threads = 2;
  Engine engine(stories().model, &stories().tokenizer, o);
  Collector c;
  std::mt19937 rng(3);
  const auto turn1 = random_prompt(rng, 100);
  auto r1 = c.wait(engine.submit(greedy_request(turn1, 20, c)));
  ASSERT_EQ(r1.tokens.size(), 20u);
  EXPECT_EQ(r1.end.usage.cached_tokens, 0u);

  // Turn 2 = history + answer + a new message. The first turn's K/V covers 119 positions (its last
  // token was sampled, never fed back): 7 full blocks of 16 = 112 tokens are reused, and the 7 rows
  // of the partly filled 8th block are copied.
  auto turn2 = turn1;
  turn2.insert(turn2.end(), r1.tokens.begin(), r1.tokens.end());
  const auto message = random_prompt(rng, 11);
  turn2.insert(turn2.end(), message.begin() + 1, message.end());
  ASSERT_EQ(turn2.size(), 130u);
  const EngineStats before = engine.stats();
  const auto r2 = c.wait(engine.submit(greedy_request(turn2, 5, c)));
  expect_all_memory_released(engine);
  const EngineStats after = engine.stats();
  EXPECT_EQ(r2.end.usage.cached_tokens, 119u);
  EXPECT_EQ(r2.end.usage.prompt_tokens, 130u);
  // Computed: the 11 uncached prompt tokens, then 4 decode steps (the 5th token is never fed).
  EXPECT_EQ(after.tokens_computed - before.tokens_computed, 11u + 4u);
  EXPECT_EQ(after.prefix_cache_queries - before.prefix_cache_queries, 130u);
  EXPECT_EQ(after.prefix_cache_hits - before.prefix_cache_hits, 119u);
  EXPECT_EQ(r2.tokens, solo(turn2, 5, KvType::F16));
}

// Sliding windows (tiny-gemma3: five local layers with a 40-position window, then a global one):
// a conversation long past the window gives up its local layers' KV behind it, yet every request
// gets the tokens of an engine that keeps everything, and a follow-up still finds its whole
// history in the prefix cache. The KV spool (on by default in serve) writes and reads back blocks
// whose layers lie apart, for a restarted engine.
struct WindowModel {
  test::TempDir dir;
  std::shared_ptr<const gguf::File> file;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  WindowModel() {
    ThreadPool pool(2);
    SyntheticModelSpec spec = synthetic_preset("tiny-gemma3");
    spec.sliding_window = 40;
    write_synthetic_model(spec, DType::F32, 5, dir.file("gemma3.gguf"), pool);
    file = gguf::File::open(dir.file("gemma3.gguf"));
    model = std::make_unique<Model>(file);
    tokenizer = std::make_unique<Tokenizer>(Vocab::from_gguf(*file));
  }
};

struct WindowConversation {
  std::vector<std::int32_t> turn1, turn2, other;
  Collector::Result r1, r2, r_other;
  std::size_t bytes_after_turn1 = 0;
  EngineStats end;
};

WindowConversation converse(const WindowModel& m, EngineOptions o, bool second_engine_for_turn2 = false) {
  o.threads = 2;
  o.kv_type = KvType::F32;
  WindowConversation w;
  std::mt19937 rng(11);
  w.turn1 = random_prompt(rng, 150);
  // Sampled, seeded: a random model's greedy text repeats one token, a draw at temperature 1 shows
  // any difference in the logits.
  auto request = [](std::vector<std::int32_t> prompt, int n, Collector& c) {
    Request r = greedy_request(std::move(prompt), n, c);
    r.sampling.temperature = 1.0f;
    r.ignore_eos = true;
    return r;
  };
  auto engine = std::make_unique<Engine>(*m.model, m.tokenizer.get(), o);
  auto c = std::make_unique<Collector>();
  w.r1 = c->wait(engine->submit(request(w.turn1, 60, *c)));
  expect_all_memory_released(*engine);
  w.bytes_after_turn1 = engine->stats().kv_bytes_in_use;
  w.turn2 = w.turn1;
  w.turn2.insert(w.turn2.end(), w.r1.tokens.begin(), w.r1.tokens.end());
  const auto message = random_prompt(rng, 12);
  w.turn2.insert(w.turn2.end(), message.begin() + 1, message.end());
  if (second_engine_for_turn2) {
    engine->flush_spool(SteadyClock::now() + std::chrono::seconds(60));
    engine.reset();
    engine = std::make_unique<Engine>(*m.model, m.tokenizer.get(), o);
    c = std::make_unique<Collector>();  // request ids start again
  }
  w.r2 = c->wait(engine->submit(request(w.turn2, 20, *c)));
  w.other.assign(w.turn1.begin(), w.turn1.begin() + 64);
  const auto tail = random_prompt(rng, 31);
  w.other.insert(w.other.end(), tail.begin() + 1, tail.end());
  w.r_other = c->wait(engine->submit(request(w.other, 20, *c)));
  expect_all_memory_released(*engine);
  w.end = engine->stats();
  return w;
}

TEST(EngineWindow, LongConversationsGiveUpLocalKvBehindTheWindowAndKeepTheirTokensAndCacheHits) {
  const WindowModel m;
  EngineOptions keep;
  keep.release_window_kv = false;
  const WindowConversation kept = converse(m, keep);
  const WindowConversation released = converse(m, EngineOptions{});
  ASSERT_EQ(kept.r1.tokens.size(), 60u);
  EXPECT_EQ(released.r1.tokens, kept.r1.tokens);
  EXPECT_EQ(released.r2.tokens, kept.r2.tokens);
  EXPECT_EQ(released.r_other.tokens, kept.r_other.tokens);
  // Turn 1's K/V covers 209 positions (its last token was never fed back): the follow-up reuses all.
  EXPECT_EQ(kept.r2.end.usage.cached_tokens, 209u);
  EXPECT_EQ(released.r2.end.usage.cached_tokens, 209u);
  // The request branching off at 64 needs the local KV of positions 24-63, given up first and
  // taken since by newer blocks: it recomputes (the prefix tree's unit tests pin down the rule).
  EXPECT_EQ(kept.r_other.end.usage.cached_tokens, 64u);
  EXPECT_EQ(released.r_other.end.usage.cached_tokens, 0u);
  // 14 blocks cached after turn 1: the global layer's KV of all, the local layers' of the last few.
  const std::size_t layer_bytes = 2 * 16 * kv_row_bytes(m.model->config().kv_dim(), KvType::F32);
  EXPECT_EQ(kept.bytes_after_turn1, 14 * 6 * layer_bytes);
  EXPECT_LT(released.bytes_after_turn1, 14 * layer_bytes + 5 * 5 * layer_bytes);
  EXPECT_LT(released.end.kv_bytes_in_use, kept.end.kv_bytes_in_use / 2);

  // The spool across a restart: turn 2 on a fresh engine reads turn 1's blocks back.
  test::TempDir dir;
  EngineOptions spooled;
  spooled.kv_spool_dir = dir.file("spool");
  const WindowConversation restarted = converse(m, spooled, /*second_engine_for_turn2=*/true);
  EXPECT_EQ(restarted.r1.tokens, kept.r1.tokens);
  EXPECT_EQ(restarted.r2.tokens, kept.r2.tokens);
  EXPECT_EQ(restarted.r_other.tokens, kept.r_other.tokens);
  EXPECT_GE(restarted.end.spool_hit_tokens, 13u * 16);
}

// Four conversations at once, two running at a time, with the local segments sized for that (the
// engine's budget: each running sequence's window and guesses, a step's new tokens): every request
// ends with the tokens of an engine that keeps every layer's KV.
TEST(EngineWindow, ConcurrentConversationsWithSegmentsForTwoRunningKeepTheirTokens) {
  const WindowModel m;
  auto run = [&](bool release) {
    EngineOptions o;
    o.threads = 2;
    o.kv_type = KvType::F32;
    o.max_running = 2;
    o.max_batch_tokens = 64;
    o.release_window_kv = release;
    Engine engine(*m.model, m.tokenizer.get(), o);
    Collector c;
    std::mt19937 rng(5);
    std::vector<std::uint64_t> ids;
    for (int i = 0; i < 4; ++i) {
      Request r = greedy_request(random_prompt(rng, 120 + 20 * static_cast<std::size_t>(i)), 50, c);
      r.sampling.temperature = 1.0f;
      r.ignore_eos = true;
      ids.push_back(engine.submit(std::move(r)));
    }
    std::vector<std::vector<std::int32_t>> tokens;
    for (std::uint64_t id : ids) tokens.push_back(c.wait(id).tokens);
    expect_all_memory_released(engine);
    return std::pair{tokens, engine.stats()};
  };
  const auto [kept, kept_stats] = run(false);
  const auto [released, released_stats] = run(true);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(kept[i].size(), 50u);
    EXPECT_EQ(released[i], kept[i]) << i;
  }
  // The same budget holds more blocks once the local layers' KV is not kept for each.
  EXPECT_GT(released_stats.kv_blocks_total, 2 * kept_stats.kv_blocks_total);
}

// Requests that share a system prompt and arrive together compute it once: the followers wait for
// the leader's blocks instead of computing their own copy.
struct SharedSystemPromptRun {
  std::size_t followers_cached_min = ~std::size_t{0}, cached = 0, computed = 0;
};
SharedSystemPromptRun run_shared_system_prompt(EngineOptions o) {
  o.threads = 2;
  o.max_batch_tokens = 64;
  Engine engine(stories().model, &stories().tokenizer, o);
  Collector c;
  std::mt19937 rng(5);
  const auto system = random_prompt(rng, 200);
  std::vector<std::pair<std::uint64_t, std::vector<std::int32_t>>> ids;
  for (int i = 0; i < 6; ++i) {
    auto prompt = system;
    for (std::int32_t t : random_prompt(rng, 6)) prompt.push_back(t == 1 ? 2 : t);
    ids.emplace_back(engine.submit(greedy_request(prompt, 4, c)), prompt);
  }
  SharedSystemPromptRun run;
  for (const auto& [id, prompt] : ids) {
    const auto r = c.wait(id);
    run.cached += r.end.usage.cached_tokens;
    if (id != ids.front().first) run.followers_cached_min = std::min(run.followers_cached_min, r.end.usage.cached_tokens);
    EXPECT_EQ(r.tokens, solo(prompt, 4, KvType::F16));
  }
  run.computed = engine.stats().tokens_computed;
  return run;
}

TEST(Engine, SharedSystemPromptIsComputedOnce) {
  // Steps of a fixed token budget: the exact counts do not depend on the machine's timing.
  EngineOptions o;
  o.itl_target_ms = 0;
  const SharedSystemPromptRun run = run_shared_system_prompt(o);
  EXPECT_EQ(run.cached, 5u * 192u);  // 12 full blocks of the system prompt, for every follower
  // 206 for the leader, 14 for each follower, 3 decode tokens each.
  EXPECT_EQ(run.computed, 206u + 5 * 14u + 6 * 3u);
}

TEST(Engine, SharedSystemPromptIsComputedOnceWithTheDefaults) {
  // Steps sized in time: how the chunks fall depends on the machine, and a follower that reaches
  // its last block after the leader finished copies the leader's partly filled block too (more
  // reuse); the system prompt is still computed once.
  const SharedSystemPromptRun run = run_shared_system_prompt(EngineOptions{});
  EXPECT_GE(run.followers_cached_min, 192u);  // every follower: at least the 12 full blocks
  EXPECT_LE(run.computed, 206u + 5 * 14u + 6 * 3u);
}

// A KV budget far below the demand: cached blocks are evicted and requests preempted, yet every
// request finishes with its solo output and all memory comes back.
TEST(Engine, TinyKvBudgetEvictsAndPreemptsButFinishesEverything) {
  EngineOptions o;
  o.threads = 2;
  o.kv_type = KvType::F32;
  o.block_tokens = 8;
  const ModelConfig& cfg = stories().model.config();
  o.kv_memory = 20 * BlockPool::block_bytes(cfg.n_layer, cfg.kv_dim(), 8, KvType::F32);  // 160 tokens
  o.max_batch_tokens = 48;
  Engine engine(stories().model, &stories().tokenizer, o);
  Collector c;
  std::mt19937 rng(11);
  std::vector<std::pair<std::uint64_t, std::vector<std::int32_t>>> ids;
  for (int i = 0; i < 10; ++i) {
    const auto prompt = random_prompt(rng, std::uniform_int_distribution<std::size_t>(10, 60)(rng));
    Request r = greedy_request(prompt, 40, c);
    r.ignore_eos = true;
    r.priority = i % 3;
    ids.emplace_back(engine.submit(std::move(r)), prompt);
  }
  std::size_t preempted = 0;
  for (const auto& [id, prompt] : ids) {
    const auto r = c.wait(id);
    EXPECT_EQ(r.end.finish_reason, FinishReason::Length);
    EXPECT_EQ(r.tokens, solo(prompt, 40, KvType::F32)) << "prompt of " << prompt.size();
    if (r.end.usage.preemptions > 0) {  // its preemption and resumption are stamped in order
      ++preempted;
      EXPECT_LT(r.end.times.scheduled, r.end.times.preempted);
      EXPECT_LE(r.end.times.preempted, r.end.times.resumed);
      EXPECT_LE(r.end.times.resumed, r.end.times.finished);
    }
  }
  EXPECT_GT(preempted, 0u);
  const EngineStats st = engine.stats();
  EXPECT_GT(st.preemptions, 0u);
  EXPECT_LE(st.kv_blocks_total, 20u);
  expect_all_memory_released(engine);

  // A request longer than the whole budget is refused up front, with the numbers.
  try {
    engine.submit(greedy_request(random_prompt(rng, 200), 1, c));
    FAIL() << "an over-budget prompt was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache budget holds 160"), std::string::npos) << e.what();
  }
  // One that outgrows the budget while generating ends as "length".
  Request grow = greedy_request(random_prompt(rng, 100), 500, c);
  grow.ignore_eos = true;
  const auto r = c.wait(engine.submit(std::move(grow)));
  EXPECT_EQ(r.end.finish_reason, FinishReason::Length);
  EXPECT_EQ(r.tokens.size(), 61u);  // 160 positions: 100 prompt + 60 fed back; the 61st is sampled from the last
  expect_all_memory_released(engine);
}

TEST(Engine, CancellationAndTimeoutFreeEveryBlock) {
  EngineOptions o;
  o.threads = 2;
  o.ctx_size = 4096;
  Engine engine(stories().model, &stories().tokenizer, o);
  Collector c;
  std::mt19937 rng(13);
  Request a = greedy_request(random_prompt(rng, 50), -1, c);
  a.ignore_eos = true;
  const auto id_a = engine.submit(std::move(a));
  Request b = greedy_request(random_prompt(rng, 30), -1, c);
  b.ignore_eos = true;
  b.timeout_s = 0.05;
  const auto id_b = engine.submit(std::move(b));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(engine.cancel(id_a));
  const auto ra = c.wait(id_a);
  const auto rb = c.wait(id_b);
  EXPECT_EQ(ra.end.finish_reason, FinishReason::Cancelled);
  EXPECT_EQ(rb.end.finish_reason, FinishReason::Timeout);
  EXPECT_GE(rb.end.times.e2e_seconds(), 0.05);
  EXPECT_LT(rb.end.times.e2e_seconds(), 5.0);
  EXPECT_FALSE(engine.cancel(id_a));  // already finished
  EXPECT_FALSE(engine.cancel(987654));
  expect_all_memory_released(engine);
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.finished[static_cast<int>(FinishReason::Cancelled)], 1u);
  EXPECT_EQ(st.finished[static_cast<int>(FinishReason::Timeout)], 1u);

  // Waiting requests can be cancelled too, and destroying the engine cancels what is left.
  Collector c2;
  std::vector<std::uint64_t> ids;
  {
    EngineOptions one = o;
    one.max_running = 1;
    Engine e2(stories().model, &stories().tokenizer, one);
    for (int i = 0; i < 3; ++i) {
      Request r = greedy_request(random_prompt(rng, 20), -1, c2);
      r.ignore_eos = true;
      ids.push_back(e2.submit(std::move(r)));
    }
    EXPECT_TRUE(e2.cancel(ids[2]));
    EXPECT_EQ(c2.wait(ids[2]).end.finish_reason, FinishReason::Cancelled);
  }
  for (std::uint64_t id : ids) EXPECT_EQ(c2.wait(id).end.finish_reason, FinishReason::Cancelled);
}

TEST(Engine, HigherPriorityIsAdmittedFirst) {
  EngineOptions o;
  o.threads = 2;
  o.max_running = 1;
  Engine engine(stories().model, &stories().tokenizer, o);
  Collector c;
  std::mt19937 rng(17);
  Request blocker = greedy_request(random_prompt(rng, 10), 300, c);
  blocker.ignore_eos = true;
  const auto id_x = engine.submit(std::move(blocker));
  while (engine.stats().decoding == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));  // it holds the only slot
  Request low = greedy_request(random_prompt(rng, 10), 5, c), high = greedy_request(random_prompt(rng, 10), 5, c);
  high.priority = 5;
  const auto id_low = engine.submit(std::move(low));
  const auto id_high = engine.submit(std::move(high));
  const auto rx = c.wait(id_x), rl = c.wait(id_low), rh = c.wait(id_high);
  EXPECT_LT(rh.end.times.scheduled, rl.end.times.scheduled);
  EXPECT_LE(rx.end.times.finished, rh.end.times.scheduled);
}

TEST(Engine, StopStringsEndGenerationAndAreNeverShown) {
  EngineOptions o;
  o.threads = 2;
  o.kv_type = KvType::F32;
  Engine engine(stories().model, &stories().tokenizer, o);
  Collector c;
  const std::string full = test::read_file(test::shared_model("testvectors/stories260K.greedy200.txt"));
  // A stop string that spans several tokens, first seen some way into the text.
  const std::size_t at = full.find(" the ", 100);
  ASSERT_NE(at, std::string::npos);
  const std::string stop = full.substr(at, 7);
  Request r = greedy_request({1}, 200, c);
  r.stop = {"never appears", stop};
  const auto result = c.wait(engine.submit(std::move(r)));
  EXPECT_EQ(result.end.finish_reason, FinishReason::Stop);
  EXPECT_EQ(result.text, full.substr(0, full.find(stop)));
  EXPECT_LT(result.tokens.size(), 200u);

  // A stop string that never completes: everything held back is shown at the end.
  Request r2 = greedy_request({1}, 30, c);
  r2.stop = {"zzzz"};
  const auto result2 = c.wait(engine.submit(std::move(r2)));
  EXPECT_EQ(result2.end.finish_reason, FinishReason::Length);
  EXPECT_EQ(result2.text, full.substr(0, result2.text.size()));
  EXPECT_FALSE(result2.text.empty());
}

TEST(Engine, LogprobsAndLogitBias) {
  EngineOptions o;
  o.threads = 1;
  Engine engine(stories().model, &stories().tokenizer, o);
  std::mutex m;
  std::vector<EngineEvent> events;
  Request r;
  r.prompt = {1};
  r.max_tokens = 3;
  r.sampling.temperature = 0;
  r.top_logprobs = 3;
  r.logit_bias = {{42, 100.0f}};  // forces token 42
  std::promise<void> done;
  r.on_event = [&](const EngineEvent& e) {
    std::lock_guard lock(m);
    events.push_back(e);
    if (e.kind == EngineEvent::Kind::Finished) done.set_value();
  };
  engine.submit(std::move(r));
  done.get_future().wait();
  ASSERT_EQ(events.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(events[i].token, 42);
    ASSERT_EQ(events[i].top_logprobs.size(), 3u);
    EXPECT_EQ(events[i].top_logprobs[0].token, 42);
    EXPECT_NEAR(events[i].logprob, 0.0f, 1e-3);  // a +100 bias makes it certain
    EXPECT_LE(events[i].top_logprobs[1].logprob, events[i].top_logprobs[0].logprob);
  }
}

TEST(Engine, RejectsRequestsThatCanNeverRun) {
  EngineOptions o;
  o.threads = 1;
  o.ctx_size = 64;
  Engine engine(stories().model, &stories().tokenizer, o);
  Collector c;
  EXPECT_THROW(engine.submit(greedy_request({}, 5, c)), Error);
  EXPECT_THROW(engine.submit(greedy_request(std::vector<std::int32_t>(64, 5), 5, c)), Error);
  EXPECT_THROW(engine.submit(greedy_request({1, 99999}, 5, c)), Error);
  Request bad_bias = greedy_request({1}, 5, c);
  bad_bias.logit_bias = {{-1, 1.0f}};
  EXPECT_THROW(engine.submit(std::move(bad_bias)), Error);
  // The context bounds generation: 60 prompt tokens leave 4.
  Request r = greedy_request(std::vector<std::int32_t>(60, 5), 100, c);
  r.ignore_eos = true;
  const auto res = c.wait(engine.submit(std::move(r)));
  EXPECT_EQ(res.tokens.size(), 4u);
  EXPECT_EQ(res.end.finish_reason, FinishReason::Length);
  EXPECT_THROW(parse_memory_size("lots"), Error);
  EXPECT_EQ(parse_memory_size("2GiB"), std::size_t{2} << 30);
  EXPECT_EQ(parse_memory_size("300MB"), 300000000u);
  EXPECT_GT(parse_memory_size("10%"), 0u);
}

// Speculation inside the engine's steps (EngineOptions::spec) on the trained code pair: streams keep
// exactly their greedy tokens, with prefix-cache hits, beside other streams and after a cancel.
struct CodePair {
  std::shared_ptr<const gguf::File> target_file, draft_file;
  Model target, draft;
  Tokenizer tokenizer;
  CodePair()
      : target_file(gguf::File::open(test::shared_model("code/code-target-f16.gguf"))),
        draft_file(gguf::File::open(test::shared_model("code/code-draft-f16.gguf"))),
        target(target_file),
        draft(draft_file),
        tokenizer(Vocab::from_gguf(*target_file)) {}
};
const CodePair& code_pair() {
  static const CodePair m;
  return m;
}

std::vector<std::int32_t> code_prompt(std::size_t offset) {
  const std::string text = test::read_file(test::shared_model("code/val.txt")).substr(offset, 700);
  return code_pair().tokenizer.encode(text, true, false);
}

std::vector<std::int32_t> code_solo(const std::vector<std::int32_t>& prompt, int n) {
  ThreadPool pool(1);
  GenerateOptions o;
  o.max_tokens = n;
  o.sampling.temperature = 0;
  o.ignore_eos = true;
  return generate(code_pair().target, code_pair().tokenizer, prompt, o, pool).ids;
}

Request code_request(std::vector<std::int32_t> prompt, int max_tokens, Collector& c) {
  Request r = greedy_request(std::move(prompt), max_tokens, c);
  r.ignore_eos = true;
  return r;
}

EngineOptions speculating(EngineOptions::Spec spec) {
  EngineOptions o;
  o.kv_type = KvType::F32;
  o.threads = 2;
  o.spec = spec;
  o.draft = &code_pair().draft;
  o.spec_tokens = 3;
  return o;
}

TEST(EngineSpec, StreamsKeepTheirGreedyTokensWithCacheHitsAndNeighbours) {
  const auto a = code_prompt(1000), b = code_prompt(30000);
  const auto ref_a = code_solo(a, 60), ref_b = code_solo(b, 60);
  for (const auto spec : {EngineOptions::Spec::Ngram, EngineOptions::Spec::Draft, EngineOptions::Spec::Tree}) {
    EngineOptions options = speculating(spec);
    if (spec == EngineOptions::Spec::Tree) options.spec_tokens = 8;  // a tree's nodes (depth 4, width 2)
    Engine engine(code_pair().target, &code_pair().tokenizer, options);
    Collector c;
    const auto first = engine.submit(code_request(a, 60, c));
    EXPECT_EQ(c.wait(first).tokens, ref_a);
    // Two streams at once (speculated: spec_max_streams is 2), the first a prefix-cache hit.
    const auto again = engine.submit(code_request(a, 60, c));
    const auto other = engine.submit(code_request(b, 60, c));
    const auto r_again = c.wait(again);
    EXPECT_EQ(r_again.tokens, ref_a);
    EXPECT_GT(r_again.end.usage.cached_tokens, 0u);
    EXPECT_EQ(c.wait(other).tokens, ref_b);
    // Four at once: more than spec_max_streams, so mostly plain steps; still the same tokens.
    std::vector<std::uint64_t> ids;
    for (int i = 0; i < 4; ++i) ids.push_back(engine.submit(code_request(i % 2 ? b : a, 40, c)));
    for (int i = 0; i < 4; ++i) {
      const auto ref = i % 2 ? ref_b : ref_a;
      EXPECT_EQ(c.wait(ids[static_cast<std::size_t>(i)]).tokens, std::vector<std::int32_t>(ref.begin(), ref.begin() + 40));
    }
    const EngineStats st = engine.stats();
    EXPECT_GT(st.spec_drafts, 0u);
    EXPECT_GT(st.spec_accepted_tokens, 0u);
    EXPECT_LE(st.spec_accepted_tokens, st.spec_draft_tokens);
    EXPECT_GT(st.spec_accepted_per_pos[0], 0u);
    expect_all_memory_released(engine);
  }
}

TEST(EngineSpec, CancelMidStreamThenTheNextRequestIsExact) {
  Engine engine(code_pair().target, &code_pair().tokenizer, speculating(EngineOptions::Spec::Draft));
  Collector c;
  const auto prompt = code_prompt(5000);
  std::promise<void> started;
  bool signalled = false;
  Request r = code_request(prompt, 500, c);
  const EventCallback inner = r.on_event;
  r.on_event = [&, inner](const EngineEvent& e) {
    inner(e);
    if (!signalled && e.kind == EngineEvent::Kind::Token) {
      signalled = true;
      started.set_value();
    }
  };
  const auto id = engine.submit(std::move(r));
  started.get_future().wait();
  engine.cancel(id);
  const auto cancelled = c.wait(id);
  EXPECT_EQ(cancelled.end.finish_reason, FinishReason::Cancelled);
  EXPECT_LT(cancelled.tokens.size(), 500u);
  const auto next = engine.submit(code_request(prompt, 50, c));
  EXPECT_EQ(c.wait(next).tokens, code_solo(prompt, 50));
  expect_all_memory_released(engine);
}

TEST(EngineSpec, OptedOutAndLogprobRequestsAreNotSpeculated) {
  Engine engine(code_pair().target, &code_pair().tokenizer, speculating(EngineOptions::Spec::Ngram));
  Collector c;
  const auto prompt = code_prompt(8000);
  Request off = code_request(prompt, 30, c);
  off.speculative = false;
  EXPECT_EQ(c.wait(engine.submit(std::move(off))).tokens, code_solo(prompt, 30));
  Request logprobs = code_request(prompt, 30, c);
  logprobs.top_logprobs = 2;
  EXPECT_EQ(c.wait(engine.submit(std::move(logprobs))).tokens, code_solo(prompt, 30));
  EXPECT_EQ(engine.stats().spec_drafts, 0u);
}

// serve's default speculates greedy requests only: a sampled one is left alone (its seeded draws
// would otherwise depend on which steps speculated).
TEST(EngineSpec, GreedyOnlySpeculationLeavesSampledRequestsAlone) {
  EngineOptions o = speculating(EngineOptions::Spec::Ngram);
  o.spec_sampled = false;
  Engine engine(code_pair().target, &code_pair().tokenizer, o);
  Collector c;
  const auto prompt = code_prompt(12000);
  Request sampled = code_request(prompt, 40, c);
  sampled.sampling.temperature = 1.0f;
  sampled.sampling.seed = 3;
  c.wait(engine.submit(std::move(sampled)));
  EXPECT_EQ(engine.stats().spec_drafts, 0u);
  EXPECT_EQ(c.wait(engine.submit(code_request(prompt, 40, c))).tokens, code_solo(prompt, 40));
  EXPECT_GT(engine.stats().spec_drafts, 0u);
}

}  // namespace
}  // namespace promptly

namespace promptly {
namespace {

std::shared_ptr<const grammar::GrammarIndex> schema_grammar(const std::string& schema) {
  static const auto vocab = grammar::token_bytes_of(stories().tokenizer);
  return std::make_shared<grammar::GrammarIndex>(
      grammar::compile(grammar::parse_gbnf(grammar::json_schema_to_gbnf(nlohmann::ordered_json::parse(schema)))), vocab);
}

// A model that knows nothing of JSON writes valid JSON of the schema when constrained: sampled at
// temperature 1 with several seeds, greedy, with logprobs (the constrained distribution's), and
// several streams at once.
TEST(EngineGrammar, OutputMatchesTheSchemaWhateverTheWeights) {
  const std::string schema =
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},"n":{"type":"integer","minimum":-5,"maximum":5},"ok":{"type":"boolean"},"tags":{"type":"array","items":{"enum":["a","bc"]},"maxItems":3}},"required":["name","n","ok","tags"]})";
  auto index = schema_grammar(schema);
  EngineOptions o;
  o.threads = 1;
  Engine engine(stories().model, &stories().tokenizer, o);
  Collector c;
  std::vector<std::uint64_t> ids;
  std::vector<bool> with_logprobs;
  for (int i = 0; i < 6; ++i) {
    Request r;
    r.prompt = {1, 403, 407};
    r.max_tokens = 400;
    r.sampling.temperature = i == 0 ? 0.0f : 1.0f;
    r.sampling.seed = static_cast<std::uint64_t>(i);
    r.top_logprobs = i == 1 ? 2 : -1;
    r.grammar = index;
    r.on_event = c.callback();
    ids.push_back(engine.submit(std::move(r)));
  }
  for (std::uint64_t id : ids) {
    Collector::Result res = c.wait(id);
    EXPECT_EQ(res.end.finish_reason, FinishReason::Stop) << res.text;
    nlohmann::json v = nlohmann::json::parse(res.text);
    ASSERT_TRUE(v.is_object()) << res.text;
    EXPECT_TRUE(v["name"].is_string() && v["name"].get<std::string>().size() <= 8 * 4) << res.text;
    EXPECT_TRUE(v["n"].is_number_integer() && std::abs(v["n"].get<int>()) <= 5) << res.text;
    EXPECT_TRUE(v["ok"].is_boolean()) << res.text;
    EXPECT_LE(v["tags"].size(), 3u) << res.text;
  }
  expect_all_memory_released(engine);
}

TEST(EngineGrammar, LengthLimitInsideAValueStopsWithLength) {
  auto index = schema_grammar(R"({"type":"object","properties":{"s":{"type":"string"}},"required":["s"]})");
  EngineOptions o;
  o.threads = 1;
  Engine engine(stories().model, &stories().tokenizer, o);
  Collector c;
  Request r;
  r.prompt = {1};
  r.max_tokens = 3;
  r.sampling.temperature = 0;
  r.grammar = index;
  r.on_event = c.callback();
  const Collector::Result res = c.wait(engine.submit(std::move(r)));
  EXPECT_EQ(res.end.finish_reason, FinishReason::Length);
  EXPECT_EQ(res.tokens.size(), 3u);
  EXPECT_EQ(res.text.rfind("{", 0), 0u) << res.text;  // as far as it got
}

}  // namespace
}  // namespace promptly
