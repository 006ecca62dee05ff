// `promptly bench engine`: the serving engine driven in-process through its public API, in the
// situations a chat server lives in: conversations that come back for another turn, many requests
// behind one system prompt, a long prompt landing among live streams, and many streams at once.
// Prompts are random token ids (the model's weights are random too); what is measured is the
// engine: reuse, scheduling and batching.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <unistd.h>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "cli/commands.h"
#include "model/builtin_model.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "kernels/cpu.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/process.h"

namespace promptly::cli {
namespace {

using json = nlohmann::json;

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

double ms(SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Collects every request's events so the scenario code can wait on them.
class Client {
 public:
  struct Result {
    std::vector<std::int32_t> tokens;
    std::vector<SteadyClock::time_point> token_times;
    bool finished = false;
    EngineEvent end;
  };

  std::uint64_t submit(Engine& engine, Request r) {
    r.on_event = [this](const EngineEvent& e) {
      std::lock_guard lock(mutex_);
      Result& res = results_[e.request_id];
      if (e.kind == EngineEvent::Kind::Token) {
        res.tokens.push_back(e.token);
        res.token_times.push_back(e.time);
        if (res.tokens.size() == 1) changed_.notify_all();
      } else {
        res.finished = true;
        res.end = e;
        changed_.notify_all();
      }
    };
    return engine.submit(std::move(r));
  }

  Result wait(std::uint64_t id) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return results_[id].finished; });
    return results_[id];
  }
  void wait_first_token(std::uint64_t id) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !results_[id].tokens.empty() || results_[id].finished; });
  }
  Result snapshot(std::uint64_t id) {
    std::lock_guard lock(mutex_);
    return results_[id];
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::uint64_t, Result> results_;
};

class Scenario {
 public:
  Scenario(const Model& model, const BenchEngineOptions& o) : model_(model), o_(o), rng_(o.seed) {}

  std::vector<std::int32_t> tokens(std::size_t n) {
    std::uniform_int_distribution<std::int32_t> tok(3, static_cast<std::int32_t>(model_.config().n_vocab) - 1);
    std::vector<std::int32_t> v(n);
    for (auto& t : v) t = tok(rng_);
    return v;
  }
  Request request(std::vector<std::int32_t> prompt, int max_tokens, int priority = 0) const {
    Request r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.ignore_eos = true;  // random weights: generation lengths are set by the scenario, not by chance
    r.priority = priority;
    return r;
  }
  EngineOptions engine_options(std::size_t ctx = 0) const {
    EngineOptions e = o_.engine.to_options();
    e.ctx_size = ctx;
    return e;
  }

  json multiturn();
  json sessions();
  json shared_prefix();
  json burst();
  json head_of_line();
  json throughput();
  json spool();
  // The largest KV budget any engine of the run had (for the peak-RSS bound).
  std::size_t max_kv_budget() const { return max_kv_budget_; }

 private:
  // The KV budget, plus what a spool may hold in memory (its write queue and recycled buffers).
  void note(const Engine& e) {
    std::size_t bytes = e.stats().kv_budget_bytes;
    if (const KvSpool* spool = e.spool()) bytes += spool->options().write_queue_bytes + 32 * spool->settings().block_bytes;
    max_kv_budget_ = std::max(max_kv_budget_, bytes);
  }
  std::size_t max_kv_budget_ = 0;
  const Model& model_;
  const BenchEngineOptions& o_;
  std::mt19937 rng_;
};

// Conversations that each return, after a think time, with history + answer + a new message.
json Scenario::multiturn() {
  const std::size_t n_conv = static_cast<std::size_t>(o_.conversations);
  const std::size_t user_tokens = 40, answer_tokens = 60;
  Engine engine(model_, nullptr, engine_options(std::max<std::size_t>(model_.config().n_ctx_train, o_.history + 256)));
  Client client;
  struct Turn {
    std::size_t history;
    double ttft_ms;
    double queue_ms;  // of the TTFT: waiting for the step in flight to end (arrival -> scheduled)
    std::size_t cached;
  };
  std::mutex turns_mutex;
  std::vector<Turn> turns;
  std::vector<double> itl;  // every answer's gaps between tokens: what follow-ups cost those decoding
  std::vector<std::thread> users;
  std::vector<std::vector<std::int32_t>> first_messages;
  for (std::size_t c = 0; c < n_conv; ++c) {
    auto m = tokens(user_tokens);
    m[0] = 1;
    first_messages.push_back(std::move(m));
  }
  const auto t_start = SteadyClock::now();
  for (std::size_t c = 0; c < n_conv; ++c) {
    users.emplace_back([&, c] {
      std::mt19937 rng(o_.seed * 131 + c);
      std::exponential_distribution<double> think(1000.0 / o_.think_ms);
      std::uniform_int_distribution<std::int32_t> tok(3, static_cast<std::int32_t>(model_.config().n_vocab) - 1);
      std::vector<std::int32_t> history = first_messages[c];
      // The first turn starts staggered, as users do not all arrive in the same millisecond.
      std::this_thread::sleep_for(std::chrono::duration<double>(think(rng) / 4));
      for (;;) {
        const std::size_t before = history.size();
        const auto r = client.wait(client.submit(engine, request(history, static_cast<int>(answer_tokens))));
        {
          std::lock_guard lock(turns_mutex);
          turns.push_back({before, r.end.times.ttft_seconds() * 1000.0, r.end.times.queue_seconds() * 1000.0, r.end.usage.cached_tokens});
          for (std::size_t i = 1; i < r.token_times.size(); ++i) itl.push_back(ms(r.token_times[i] - r.token_times[i - 1]));
        }
        history.insert(history.end(), r.tokens.begin(), r.tokens.end());
        if (history.size() >= o_.history) break;
        for (std::size_t i = 0; i < user_tokens; ++i) history.push_back(tok(rng));
        std::this_thread::sleep_for(std::chrono::duration<double>(think(rng)));
      }
    });
  }
  for (auto& u : users) u.join();
  const double wall_s = std::chrono::duration<double>(SteadyClock::now() - t_start).count();

  // What a follow-up would cost without the prefix cache: the same history computed from scratch.
  const std::size_t cold_len = o_.history;
  const auto cold = client.wait(client.submit(engine, request(tokens(cold_len), 1)));

  std::vector<double> follow_ttft, late_ttft, late_queue;
  std::size_t follow_prompt = 0, follow_cached = 0;
  for (const Turn& t : turns) {
    if (t.history <= user_tokens) continue;  // first turns
    follow_ttft.push_back(t.ttft_ms);
    follow_prompt += t.history;
    follow_cached += t.cached;
    if (t.history + 2 * (user_tokens + answer_tokens) >= o_.history) {
      late_ttft.push_back(t.ttft_ms);
      late_queue.push_back(t.queue_ms);
    }
  }
  const EngineStats st = engine.stats();
  note(engine);
  return {{"scenario", "multiturn"},
          {"conversations", n_conv},
          {"turns", turns.size()},
          {"history_target", o_.history},
          {"think_ms_mean", o_.think_ms},
          {"followup_ttft_ms", {{"p50", quantile(follow_ttft, 0.5)}, {"p99", quantile(follow_ttft, 0.99)}, {"n", follow_ttft.size()}}},
          {"late_followup_ttft_ms", {{"p50", quantile(late_ttft, 0.5)}, {"p99", quantile(late_ttft, 0.99)}, {"n", late_ttft.size()}}},
          {"late_followup_queue_ms", {{"p50", quantile(late_queue, 0.5)}, {"p99", quantile(late_queue, 0.99)}}},
          {"itl_ms", {{"p50", quantile(itl, 0.5)}, {"p99", quantile(itl, 0.99)}, {"n", itl.size()}}},
          {"followup_cached_fraction", follow_prompt ? static_cast<double>(follow_cached) / static_cast<double>(follow_prompt) : 0.0},
          {"cold_prefill_ttft_ms", cold.end.times.ttft_seconds() * 1000.0},
          {"cold_prefill_tokens", cold_len},
          {"preemptions", st.preemptions},
          {"steps", st.steps},
          {"steps_interrupted", st.steps_interrupted},
          {"wall_s", wall_s}};
}

// Chat sessions that start cold: a long first turn (a pasted document, a long system prompt), then
// follow-ups of a user message each over the cached history, after a think time. Cold first turns
// compete with live sessions' follow-ups: what the follow-ups' time to first token shows.
json Scenario::sessions() {
  const std::size_t n_sessions = static_cast<std::size_t>(o_.conversations);
  const std::size_t user_tokens = 45, answer_tokens = 64;
  const std::size_t turns_per_session = static_cast<std::size_t>(std::max(1, o_.turns));
  const std::size_t ctx = std::max<std::size_t>(model_.config().n_ctx_train,
                                                o_.first_turn + turns_per_session * (user_tokens + answer_tokens) + 64);
  Engine engine(model_, nullptr, engine_options(ctx));
  Client client;
  std::mutex mutex;
  std::vector<double> first_ttft, follow_ttft, itl;
  std::vector<std::vector<std::int32_t>> first_turns;
  for (std::size_t c = 0; c < n_sessions; ++c) {
    auto m = tokens(o_.first_turn);
    m[0] = 1;
    first_turns.push_back(std::move(m));
  }
  const auto t_start = SteadyClock::now();
  std::vector<std::thread> users;
  for (std::size_t c = 0; c < n_sessions; ++c) {
    users.emplace_back([&, c] {
      std::mt19937 rng(o_.seed * 977 + c);
      std::exponential_distribution<double> think(1000.0 / o_.think_ms);
      std::uniform_real_distribution<double> start(0.0, o_.think_ms / 1000.0);
      std::uniform_int_distribution<std::int32_t> tok(3, static_cast<std::int32_t>(model_.config().n_vocab) - 1);
      std::vector<std::int32_t> history = first_turns[c];
      std::this_thread::sleep_for(std::chrono::duration<double>(start(rng)));  // users do not all arrive at once
      for (std::size_t turn = 0; turn < turns_per_session; ++turn) {
        const auto r = client.wait(client.submit(engine, request(history, static_cast<int>(answer_tokens))));
        {
          std::lock_guard lock(mutex);
          (turn == 0 ? first_ttft : follow_ttft).push_back(r.end.times.ttft_seconds() * 1000.0);
          for (std::size_t i = 1; i < r.token_times.size(); ++i) itl.push_back(ms(r.token_times[i] - r.token_times[i - 1]));
        }
        history.insert(history.end(), r.tokens.begin(), r.tokens.end());
        for (std::size_t i = 0; i < user_tokens; ++i) history.push_back(tok(rng));
        std::this_thread::sleep_for(std::chrono::duration<double>(think(rng)));
      }
    });
  }
  for (auto& u : users) u.join();
  note(engine);
  const EngineStats st = engine.stats();
  return {{"scenario", "sessions"},
          {"sessions", n_sessions},
          {"turns", turns_per_session},
          {"first_turn_tokens", o_.first_turn},
          {"user_tokens", user_tokens},
          {"answer_tokens", answer_tokens},
          {"think_ms_mean", o_.think_ms},
          {"followup_ttft_ms", {{"p50", quantile(follow_ttft, 0.5)}, {"p99", quantile(follow_ttft, 0.99)}, {"max", quantile(follow_ttft, 1.0)}, {"n", follow_ttft.size()}}},
          {"first_turn_ttft_ms", {{"p50", quantile(first_ttft, 0.5)}, {"p99", quantile(first_ttft, 0.99)}}},
          {"itl_ms", {{"p50", quantile(itl, 0.5)}, {"p99", quantile(itl, 0.99)}}},
          {"step_limit_ms", st.step_limit_ms},
          {"wall_s", std::chrono::duration<double>(SteadyClock::now() - t_start).count()}};
}

// A burst behind one system prompt: one request warms the prefix cache, then the others arrive
// together, each with its own user message. Their times to first token show whether they complete
// one after another (p50 well below p99) or all together at the end.
json Scenario::burst() {
  const std::size_t n = 16, user_len = 90, answer_tokens = 64;
  auto system = tokens(o_.system_tokens);
  system[0] = 1;
  Engine engine(model_, nullptr, engine_options(std::max<std::size_t>(model_.config().n_ctx_train, o_.system_tokens + user_len + answer_tokens + 16)));
  Client client;
  auto prompt = [&] {
    auto p = system;
    const auto user = tokens(user_len);
    p.insert(p.end(), user.begin(), user.end());
    return p;
  };
  const auto first = client.wait(client.submit(engine, request(prompt(), static_cast<int>(answer_tokens))));
  std::vector<std::uint64_t> ids;
  for (std::size_t i = 1; i < n; ++i) ids.push_back(client.submit(engine, request(prompt(), static_cast<int>(answer_tokens))));
  std::vector<double> ttft;
  std::size_t computed = 0;
  for (auto id : ids) {
    const auto r = client.wait(id);
    ttft.push_back(r.end.times.ttft_seconds() * 1000.0);
    computed += r.end.usage.prompt_tokens - r.end.usage.cached_tokens;
  }
  note(engine);
  const double p50 = quantile(ttft, 0.5), p99 = quantile(ttft, 0.99);
  return {{"scenario", "burst"},
          {"requests", n},
          {"system_tokens", o_.system_tokens},
          {"user_tokens", user_len},
          {"first_ttft_ms", first.end.times.ttft_seconds() * 1000.0},
          {"ttft_ms", {{"p50", p50}, {"p99", p99}, {"min", quantile(ttft, 0.0)}}},
          {"p50_over_p99", p50 / p99},
          {"new_tokens_per_request", static_cast<double>(computed) / static_cast<double>(ids.size())}};
}

// Many requests behind one long system prompt, all at once.
json Scenario::shared_prefix() {
  const std::size_t n = 16, system_len = 1000, user_len = 30;
  auto system = tokens(system_len);
  system[0] = 1;
  Engine engine(model_, nullptr, engine_options());
  Client client;
  std::size_t prompt_tokens = 0;
  std::vector<std::uint64_t> ids;
  const auto t0 = SteadyClock::now();
  for (std::size_t i = 0; i < n; ++i) {
    auto prompt = system;
    const auto user = tokens(user_len);
    prompt.insert(prompt.end(), user.begin(), user.end());
    prompt_tokens += prompt.size();
    ids.push_back(client.submit(engine, request(prompt, 16)));
  }
  std::vector<double> ttft;
  for (auto id : ids) ttft.push_back(client.wait(id).end.times.ttft_seconds() * 1000.0);
  const double wall_s = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  const EngineStats st = engine.stats();
  note(engine);
  const std::uint64_t decode_tokens = n * 15;  // each request feeds back 15 of its 16 tokens
  const std::uint64_t prefill_computed = st.tokens_computed - decode_tokens;
  return {{"scenario", "shared-prefix"},
          {"requests", n},
          {"system_tokens", system_len},
          {"prompt_tokens", prompt_tokens},
          {"prefill_tokens_computed", prefill_computed},
          {"prefill_work_reduction", static_cast<double>(prompt_tokens) / static_cast<double>(prefill_computed)},
          {"prefix_cache_hits", st.prefix_cache_hits},
          {"ttft_ms", {{"p50", quantile(ttft, 0.5)}, {"p99", quantile(ttft, 0.99)}}},
          {"wall_s", wall_s}};
}

// A long prompt arrives while streams decode: their inter-token latency during its prefill, and
// its prefill speed, against the same prompt alone and against one unchunked step.
json Scenario::head_of_line() {
  const std::size_t long_len = o_.long_prompt, n_streams = 4;
  const std::size_t ctx = std::max<std::size_t>(model_.config().n_ctx_train, long_len + 4096);
  const auto long_prompt = tokens(long_len);
  const auto run = [&](bool with_streams, std::size_t max_batch_tokens, double itl_target_ms) {
    EngineOptions eo = engine_options(ctx);
    eo.max_batch_tokens = max_batch_tokens;
    eo.itl_target_ms = itl_target_ms;
    eo.prefix_cache = false;  // every run computes the long prompt in full
    Engine engine(model_, nullptr, eo);
    Client client;
    std::vector<std::uint64_t> streams;
    if (with_streams) {
      for (std::size_t i = 0; i < n_streams; ++i) streams.push_back(client.submit(engine, request(tokens(32), -1)));
      for (auto id : streams) client.wait_first_token(id);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // steady decoding before the long prompt lands
    }
    const auto id = client.submit(engine, request(long_prompt, 1));
    const auto r = client.wait(id);
    std::vector<double> itl;
    for (auto s : streams) {
      engine.cancel(s);
      const auto sr = client.wait(s);
      for (std::size_t i = 1; i < sr.token_times.size(); ++i) {
        // Gaps that overlap the long prompt's prefill.
        if (sr.token_times[i] >= r.end.times.scheduled && sr.token_times[i - 1] <= r.end.times.first_token) {
          itl.push_back(ms(sr.token_times[i] - sr.token_times[i - 1]));
        }
      }
    }
    note(engine);
    const double prefill_s = r.end.times.prefill_seconds();
    return json{{"prefill_s", prefill_s},
                {"prefill_tps", static_cast<double>(long_len) / prefill_s},
                {"stream_itl_ms", {{"p50", quantile(itl, 0.5)}, {"p99", quantile(itl, 0.99)}, {"max", quantile(itl, 1.0)}, {"n", itl.size()}}}};
  };
  const std::size_t big = std::max<std::size_t>(o_.engine.max_batch_tokens, long_len);
  // The solo speed is measured before and after the chunked run and averaged: this machine's speed
  // drifts by up to 2x over minutes, and one solo run long before or after would skew the fraction.
  // Solo and chunked with the engine's settings (the defaults unless flags say otherwise); unchunked:
  // the whole prompt in one step, no ITL target, what a server without chunked prefill does.
  const double itl_target = o_.engine.itl_target_ms;
  json solo = run(false, o_.engine.max_batch_tokens, itl_target);
  json unchunked = run(true, big, 0);
  json chunked = run(true, o_.engine.max_batch_tokens, itl_target);
  // A chat's follow-up (40 tokens) arriving 1 s into the long prompt's prefill, with the step budget
  // and no streams: its time to first token, which short prompts first keeps to its own step plus
  // what is left of the step in flight, at most half of it (without it: the whole long prefill).
  json follow_up = [&] {
    constexpr std::size_t kFollowUpTokens = 40;
    constexpr auto kArrivesAfter = std::chrono::seconds(1);
    EngineOptions eo = engine_options(ctx);
    eo.prefix_cache = false;
    Engine engine(model_, nullptr, eo);
    Client client;
    const auto long_id = client.submit(engine, request(long_prompt, 1));
    std::this_thread::sleep_for(kArrivesAfter);
    const auto short_id = client.submit(engine, request(tokens(kFollowUpTokens), 1));
    const auto short_r = client.wait(short_id);
    const auto long_r = client.wait(long_id);
    note(engine);
    return json{{"prompt_tokens", kFollowUpTokens},
                {"arrives_after_ms", ms(kArrivesAfter)},
                {"ttft_ms", short_r.end.times.ttft_seconds() * 1000.0},
                {"long_prompt_ttft_ms", long_r.end.times.ttft_seconds() * 1000.0},
                {"steps_interrupted", engine.stats().steps_interrupted}};
  }();
  json solo_after = run(false, o_.engine.max_batch_tokens, itl_target);
  const double solo_tps = 0.5 * (solo["prefill_tps"].get<double>() + solo_after["prefill_tps"].get<double>());
  return {{"scenario", "head-of-line"},
          {"long_prompt_tokens", long_len},
          {"streams", n_streams},
          {"itl_target_ms", itl_target},
          {"solo", solo},
          {"solo_after", solo_after},
          {"follow_up_during_prefill", follow_up},
          {"solo_prefill_tps_mean", solo_tps},
          {"unchunked", unchunked},
          {"chunked", chunked},
          {"chunked_prefill_fraction_of_solo", chunked["prefill_tps"].get<double>() / solo_tps}};
}

// Aggregate decode speed of 8 streams against one.
json Scenario::throughput() {
  const int gen = o_.gen_tokens;
  auto measure = [&](std::size_t n_streams) {
    Engine engine(model_, nullptr, engine_options());
    Client client;
    std::vector<std::uint64_t> ids;
    for (std::size_t i = 0; i < n_streams; ++i) ids.push_back(client.submit(engine, request(tokens(16), gen)));
    std::vector<Client::Result> results;
    for (auto id : ids) results.push_back(client.wait(id));
    note(engine);
    // Only while every stream decodes: from the last stream's first token to the first stream's
    // last, the tokens delivered in between. Why: the first request to arrive is prefilled in a
    // step of its own and the others' prompts in the next (254 ms for 7 x 16 tokens here); a window
    // from the first token anywhere counted that prefill step as decode time (-9% for 8 streams).
    // For one stream this is its first token to its last, as before.
    SteadyClock::time_point start = SteadyClock::time_point::min(), end = SteadyClock::time_point::max();
    for (const Client::Result& r : results) {
      start = std::max(start, r.token_times.front());
      end = std::min(end, r.token_times.back());
    }
    std::size_t decoded = 0;
    for (const Client::Result& r : results) {
      decoded += static_cast<std::size_t>(std::count_if(r.token_times.begin(), r.token_times.end(),
                                                        [&](SteadyClock::time_point t) { return t > start && t <= end; }));
    }
    return static_cast<double>(decoded) / std::chrono::duration<double>(end - start).count();
  };
  // On a shared machine a single pair of measurements moves by tens of percent, so the two are
  // measured in alternation, round after round, and the ratio is that of their medians.
  std::vector<double> ones, manys;
  for (int round = 0; round < std::max(1, o_.rounds); ++round) {
    ones.push_back(measure(1));
    manys.push_back(measure(static_cast<std::size_t>(o_.streams)));
  }
  const double one = quantile(ones, 0.5), many = quantile(manys, 0.5);
  return {{"scenario", "throughput"},
          {"streams", o_.streams},
          {"gen_tokens", gen},
          {"rounds", ones.size()},
          {"one_stream_tps_each", ones},
          {"many_streams_tps_each", manys},
          {"one_stream_tps", one},
          {"many_streams_tps", many},
          {"speedup", many / one}};
}

// The KV spool (--kv-spool; a scratch directory when not given): (1) a long prompt re-sent to a
// restarted engine, cold and with a warm spool; (2) sessions whose histories overflow the KV memory
// (sized to hold spool_in_ram of them) come back for a follow-up in random order, with fresh prompts
// (misses) among them, each without and with the spool; (3) streams decoding while long prompts
// evict, without and with the spool (its writes must not stall a step).
json Scenario::spool() {
  namespace fs = std::filesystem;
  const std::string scratch = (fs::temp_directory_path() / ("promptly-bench-spool-" + std::to_string(::getpid()))).string();
  const bool own_dir = o_.engine.kv_spool.empty() || o_.engine.kv_spool == "none";
  const std::string dir = own_dir ? scratch : o_.engine.kv_spool;
  auto fresh_dir = [&](const std::string& name) {
    const std::string d = dir + "/" + name;
    fs::remove_all(d);
    return d;
  };
  const ModelConfig& c = model_.config();
  const std::size_t user_tokens = 45, answer_tokens = 16;
  const std::size_t history = std::min(o_.spool_history, c.n_ctx_train - user_tokens - 2 * answer_tokens - 8);
  const std::size_t ctx = std::max<std::size_t>(c.n_ctx_train, history + user_tokens + 2 * answer_tokens + 8);
  auto options = [&](const std::string& spool_dir, std::size_t kv_memory) {
    EngineOptions e = engine_options(ctx);
    e.kv_spool_dir = spool_dir;
    if (kv_memory) e.kv_memory = kv_memory;
    return e;
  };
  auto one = [&](Engine& engine, Client& client, const std::vector<std::int32_t>& prompt, int max_tokens) {
    return client.wait(client.submit(engine, request(prompt, max_tokens)));
  };
  json out = {{"scenario", "spool"}, {"spool_dir", dir}};

  // (1) A restart.
  {
    const std::string d = fresh_dir("restart");
    auto prompt = tokens(std::min(o_.restart_prompt, ctx - 8));
    prompt[0] = 1;
    double cold_ms = 0, warm_ms = 0;
    std::uint64_t hit_tokens = 0;
    {
      Engine engine(model_, nullptr, options(d, 0));
      note(engine);
      Client client;
      cold_ms = one(engine, client, prompt, 1).end.times.ttft_seconds() * 1000;
      engine.flush_spool(SteadyClock::now() + std::chrono::seconds(60));
    }
    {
      Engine engine(model_, nullptr, options(d, 0));
      Client client;
      const auto r = one(engine, client, prompt, 1);
      warm_ms = r.end.times.ttft_seconds() * 1000;
      hit_tokens = r.end.usage.cached_tokens;
    }
    out["restart"] = {{"prompt_tokens", prompt.size()}, {"cold_ttft_ms", cold_ms}, {"warm_ttft_ms", warm_ms},
                      {"warm_over_cold", warm_ms / cold_ms}, {"cached_tokens", hit_tokens}};
  }

  // (2) Sessions overflowing RAM, follow-ups in random order, fresh prompts among them.
  const std::size_t bt = KvCache::kDefaultBlockTokens;
  const std::size_t block_bytes = BlockPool::block_bytes(c.n_layer, c.kv_dim(), bt, parse_kv_type(o_.engine.kv_type));
  const std::size_t session_blocks = (history + user_tokens + 2 * answer_tokens + bt - 1) / bt + 1;
  const std::size_t kv_memory = std::max<std::size_t>(2, o_.spool_in_ram) * session_blocks * block_bytes;
  std::vector<std::vector<std::int32_t>> histories, fresh;
  for (std::size_t i = 0; i < o_.spool_sessions; ++i) {
    histories.push_back(tokens(history));
    histories.back()[0] = 1;
  }
  for (std::size_t i = 0; i < std::max<std::size_t>(4, o_.spool_sessions / 4); ++i) {
    fresh.push_back(tokens(history));
    fresh.back()[0] = 1;
  }
  std::vector<std::vector<std::int32_t>> follow_ups;
  for (std::size_t i = 0; i < histories.size(); ++i) {
    auto f = histories[i];
    auto more = tokens(user_tokens + answer_tokens);
    f.insert(f.end(), more.begin(), more.end());
    follow_ups.push_back(std::move(f));
  }
  std::vector<std::size_t> order(histories.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng_);
  for (const bool with_spool : {false, true}) {
    Engine engine(model_, nullptr, options(with_spool ? fresh_dir("sessions") : "", kv_memory));
    note(engine);
    Client client;
    for (const auto& h : histories) one(engine, client, h, static_cast<int>(answer_tokens));
    engine.flush_spool(SteadyClock::now() + std::chrono::seconds(60));
    std::vector<double> follow_ttft, fresh_ttft;
    std::size_t follow_cached = 0, follow_prompt = 0;
    for (std::size_t k = 0; k < order.size(); ++k) {
      const auto r = one(engine, client, follow_ups[order[k]], static_cast<int>(answer_tokens));
      follow_ttft.push_back(r.end.times.ttft_seconds() * 1000);
      follow_cached += r.end.usage.cached_tokens;
      follow_prompt += follow_ups[order[k]].size();
      if (k % 4 == 3 && k / 4 < fresh.size()) fresh_ttft.push_back(one(engine, client, fresh[k / 4], 1).end.times.ttft_seconds() * 1000);
    }
    const EngineStats st = engine.stats();
    out[with_spool ? "sessions_spool" : "sessions_ram_only"] = {
        {"sessions", histories.size()},
        {"history_tokens", history},
        {"histories_in_ram", o_.spool_in_ram},
        {"followup_ttft_ms", {{"p50", quantile(follow_ttft, 0.5)}, {"p99", quantile(follow_ttft, 0.99)}}},
        {"fresh_ttft_ms", {{"p50", quantile(fresh_ttft, 0.5)}, {"n", fresh_ttft.size()}}},
        {"followup_cached_fraction", static_cast<double>(follow_cached) / static_cast<double>(follow_prompt)},
        {"spool_hit_blocks", st.spool_hit_blocks},
        {"evicted_blocks", st.evicted_blocks}};
  }
  out["followup_p50_spool_over_ram_only"] = out["sessions_spool"]["followup_ttft_ms"]["p50"].get<double>() /
                                            out["sessions_ram_only"]["followup_ttft_ms"]["p50"].get<double>();
  out["fresh_p50_spool_over_ram_only"] =
      out["sessions_spool"]["fresh_ttft_ms"]["p50"].get<double>() / out["sessions_ram_only"]["fresh_ttft_ms"]["p50"].get<double>();

  // (3) Streams decoding while long prompts arrive and evict: rounds alternating without and with
  // the spool (the host's noise drifts), the ratio of the medians of each round's ITL p99.
  std::vector<double> p99_without, p99_with;
  json rounds = json::array();
  for (int round = 0; round < std::max(1, o_.rounds); ++round) {
    for (const bool with_spool : {false, true}) {
      Engine engine(model_, nullptr, options(with_spool ? fresh_dir("streams") : "", kv_memory));
      note(engine);
      Client client;
      std::vector<std::uint64_t> streams;
      for (int i = 0; i < 4; ++i) {
        auto p = tokens(64);
        p[0] = 1;
        streams.push_back(client.submit(engine, request(p, 10000)));
      }
      for (auto id : streams) client.wait_first_token(id);
      for (const auto& h : fresh) one(engine, client, h, 1);  // each prefill's blocks are spooled, older ones evicted
      std::vector<double> itl;
      for (auto id : streams) {
        engine.cancel(id);
        const auto r = client.wait(id);
        for (std::size_t i = 1; i < r.token_times.size(); ++i) itl.push_back(ms(r.token_times[i] - r.token_times[i - 1]));
      }
      const double p99 = quantile(itl, 0.99);
      (with_spool ? p99_with : p99_without).push_back(p99);
      json j = {{"round", round}, {"spool", with_spool}, {"itl_ms", {{"p50", quantile(itl, 0.5)}, {"p99", p99}, {"n", itl.size()}}},
                {"evicted_blocks", engine.stats().evicted_blocks}};
      if (engine.spool()) {
        const SpoolStats ss = engine.spool()->stats();
        j["spool_written"] = ss.written;
        j["spool_write_dropped"] = ss.write_dropped;
      }
      rounds.push_back(j);
    }
  }
  out["streams"] = rounds;
  out["itl_p99_ms_ram_only"] = quantile(p99_without, 0.5);
  out["itl_p99_ms_spool"] = quantile(p99_with, 0.5);
  out["itl_p99_spool_over_ram_only"] = quantile(p99_with, 0.5) / quantile(p99_without, 0.5);
  if (own_dir) fs::remove_all(scratch);
  return out;
}

}  // namespace

int bench_engine(const BenchEngineOptions& o) {
  std::shared_ptr<const gguf::File> file = open_model_file(o.model);
  Model model(file);
  const ModelConfig& c = model.config();
  // "all" leaves out spool, which writes to disk and runs the sessions twice.
  const std::vector<std::string> all = {"multiturn", "sessions", "shared-prefix", "burst", "head-of-line", "throughput"};
  std::vector<std::string> names = o.scenario == "all" ? all : std::vector<std::string>{o.scenario};
  for (const auto& n : names) {
    if (n != "spool" && std::find(all.begin(), all.end(), n) == all.end()) {
      throw Error("unknown scenario '" + n + "'; choose multiturn, sessions, shared-prefix, burst, head-of-line, throughput, spool or all");
    }
  }
  Scenario scenario(model, o);
  json results = json::array();
  for (const auto& n : names) {
    std::fprintf(stderr, "running %s ...\n", n.c_str());
    if (n == "multiturn") results.push_back(scenario.multiturn());
    if (n == "sessions") results.push_back(scenario.sessions());
    if (n == "shared-prefix") results.push_back(scenario.shared_prefix());
    if (n == "burst") results.push_back(scenario.burst());
    if (n == "head-of-line") results.push_back(scenario.head_of_line());
    if (n == "throughput") results.push_back(scenario.throughput());
    if (n == "spool") results.push_back(scenario.spool());
  }

  // Memory: bytes per cached token by the arithmetic, and what a budget holds in each KV type.
  const std::size_t per_token_f16 = BlockPool::block_bytes(c.n_layer, c.kv_dim(), 1, KvType::F16);
  const std::size_t per_token = BlockPool::block_bytes(c.n_layer, c.kv_dim(), 1, parse_kv_type(o.engine.kv_type));
  const double file_mb = static_cast<double>(file->file_size()) / 1e6;
  const double rss = peak_rss_mb();
  json memory = {{"kv_type", o.engine.kv_type},
                 {"kv_bytes_per_token", per_token},
                 {"kv_bytes_per_token_f16_arithmetic", 2 * c.n_layer * c.n_head_kv * c.head_dim * 2},
                 {"kv_bytes_per_token_f16", per_token_f16},
                 {"peak_rss_mb", rss},
                 {"file_mb", file_mb},
                 {"max_kv_budget_mb", static_cast<double>(scenario.max_kv_budget()) / 1e6},
                 {"peak_rss_bound_mb", file_mb * 1.15 + static_cast<double>(scenario.max_kv_budget()) / 1e6 + 200}};
  json out = {{"model", o.model},
              {"threads", o.engine.threads > 0 ? o.engine.threads : default_thread_count()},
              {"isa", kernels::isa_name(kernels::active_isa())},
              {"kv_type", o.engine.kv_type},
              {"max_batch_tokens", o.engine.max_batch_tokens},
              {"results", results},
              {"memory", memory}};
  if (o.json) {
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("| scenario | metric | value |\n|---|---|---|\n");
  for (const json& r : results) {
    const std::string n = r["scenario"];
    if (n == "multiturn") {
      std::printf("| multiturn | follow-up TTFT p50 / p99 (all, %zu turns) | %.0f / %.0f ms |\n", r["followup_ttft_ms"]["n"].get<std::size_t>(),
                  r["followup_ttft_ms"]["p50"].get<double>(), r["followup_ttft_ms"]["p99"].get<double>());
      std::printf("| multiturn | follow-up TTFT p50 / p99 at ~%zu history | %.0f / %.0f ms |\n", o.history,
                  r["late_followup_ttft_ms"]["p50"].get<double>(), r["late_followup_ttft_ms"]["p99"].get<double>());
      std::printf("| multiturn | of which waiting for the step in flight, p50 / p99 | %.0f / %.0f ms |\n",
                  r["late_followup_queue_ms"]["p50"].get<double>(), r["late_followup_queue_ms"]["p99"].get<double>());
      std::printf("| multiturn | answers' inter-token latency p50 / p99 | %.0f / %.0f ms |\n", r["itl_ms"]["p50"].get<double>(),
                  r["itl_ms"]["p99"].get<double>());
      std::printf("| multiturn | steps stopped early for a follow-up | %zu of %zu |\n", r["steps_interrupted"].get<std::size_t>(),
                  r["steps"].get<std::size_t>());
      std::printf("| multiturn | prompt tokens served from cache | %.1f%% |\n", 100 * r["followup_cached_fraction"].get<double>());
      std::printf("| multiturn | TTFT re-prefilling %zu tokens (no cache) | %.0f ms |\n", o.history, r["cold_prefill_ttft_ms"].get<double>());
    } else if (n == "spool") {
      const json& rs = r["restart"];
      std::printf("| spool | TTFT of a %zu-token prompt: cold / after a restart with the spool | %.0f / %.0f ms (%.1f%%) |\n",
                  rs["prompt_tokens"].get<std::size_t>(), rs["cold_ttft_ms"].get<double>(), rs["warm_ttft_ms"].get<double>(),
                  100 * rs["warm_over_cold"].get<double>());
      const json &a = r["sessions_ram_only"], &b = r["sessions_spool"];
      std::printf("| spool | follow-up TTFT p50, %zu sessions x %zu tokens, RAM for %zu: without / with the spool | %.0f / %.0f ms (%.2fx) |\n",
                  a["sessions"].get<std::size_t>(), a["history_tokens"].get<std::size_t>(), a["histories_in_ram"].get<std::size_t>(),
                  a["followup_ttft_ms"]["p50"].get<double>(), b["followup_ttft_ms"]["p50"].get<double>(),
                  r["followup_p50_spool_over_ram_only"].get<double>());
      std::printf("| spool | fresh prompts' (misses') TTFT p50: without / with | %.0f / %.0f ms (%.2fx) |\n", a["fresh_ttft_ms"]["p50"].get<double>(),
                  b["fresh_ttft_ms"]["p50"].get<double>(), r["fresh_p50_spool_over_ram_only"].get<double>());
      std::printf("| spool | 4 streams' ITL p99 while prompts evict, median of %zu rounds: without / with | %.1f / %.1f ms (%.2fx) |\n",
                  r["streams"].size() / 2, r["itl_p99_ms_ram_only"].get<double>(), r["itl_p99_ms_spool"].get<double>(),
                  r["itl_p99_spool_over_ram_only"].get<double>());
    } else if (n == "sessions") {
      std::printf("| sessions | follow-up TTFT p50 / p99 / max (%zu follow-ups; %zu sessions x %zu turns, %zu-token first turns) | %.0f / %.0f / %.0f ms |\n",
                  r["followup_ttft_ms"]["n"].get<std::size_t>(), r["sessions"].get<std::size_t>(), r["turns"].get<std::size_t>(),
                  r["first_turn_tokens"].get<std::size_t>(), r["followup_ttft_ms"]["p50"].get<double>(), r["followup_ttft_ms"]["p99"].get<double>(),
                  r["followup_ttft_ms"]["max"].get<double>());
      std::printf("| sessions | first-turn TTFT p50 / p99 | %.0f / %.0f ms |\n", r["first_turn_ttft_ms"]["p50"].get<double>(),
                  r["first_turn_ttft_ms"]["p99"].get<double>());
      std::printf("| sessions | answers' inter-token latency p50 / p99 | %.0f / %.0f ms |\n", r["itl_ms"]["p50"].get<double>(),
                  r["itl_ms"]["p99"].get<double>());
    } else if (n == "burst") {
      std::printf("| burst | TTFT p50 / p99 of %zu requests sent together after the first (%zu-token system prompt, ~%.0f new tokens each) | %.0f / %.0f ms (p50/p99 %.2f) |\n",
                  r["requests"].get<std::size_t>() - 1, r["system_tokens"].get<std::size_t>(), r["new_tokens_per_request"].get<double>(),
                  r["ttft_ms"]["p50"].get<double>(), r["ttft_ms"]["p99"].get<double>(), r["p50_over_p99"].get<double>());
    } else if (n == "shared-prefix") {
      std::printf("| shared-prefix | prefill tokens: prompts / computed | %zu / %zu (%.1fx less) |\n", r["prompt_tokens"].get<std::size_t>(),
                  r["prefill_tokens_computed"].get<std::size_t>(), r["prefill_work_reduction"].get<double>());
      std::printf("| shared-prefix | TTFT p50 / p99 | %.0f / %.0f ms |\n", r["ttft_ms"]["p50"].get<double>(), r["ttft_ms"]["p99"].get<double>());
    } else if (n == "head-of-line") {
      for (const char* mode : {"unchunked", "chunked"}) {
        std::printf("| head-of-line | %s: streams' ITL p50 / p99 / max during the %zu-token prefill | %.0f / %.0f / %.0f ms |\n", mode,
                    r["long_prompt_tokens"].get<std::size_t>(), r[mode]["stream_itl_ms"]["p50"].get<double>(),
                    r[mode]["stream_itl_ms"]["p99"].get<double>(), r[mode]["stream_itl_ms"]["max"].get<double>());
      }
      std::printf("| head-of-line | long prompt prefill t/s: solo (before, after) / unchunked / chunked | %.1f (%.1f, %.1f) / %.1f / %.1f (chunked %.0f%% of solo) |\n",
                  r["solo_prefill_tps_mean"].get<double>(), r["solo"]["prefill_tps"].get<double>(), r["solo_after"]["prefill_tps"].get<double>(),
                  r["unchunked"]["prefill_tps"].get<double>(), r["chunked"]["prefill_tps"].get<double>(),
                  100 * r["chunked_prefill_fraction_of_solo"].get<double>());
      const json& f = r["follow_up_during_prefill"];
      std::printf("| head-of-line | a %zu-token prompt arriving %.0f s into the long prefill: its TTFT / the long prompt's | %.0f / %.0f ms |\n",
                  f["prompt_tokens"].get<std::size_t>(), f["arrives_after_ms"].get<double>() / 1000.0, f["ttft_ms"].get<double>(),
                  f["long_prompt_ttft_ms"].get<double>());
    } else if (n == "throughput") {
      std::printf("| throughput | decode t/s: 1 stream / %d streams (medians of %zu alternating rounds) | %.1f / %.1f (%.2fx) |\n",
                  r["streams"].get<int>(), r["rounds"].get<std::size_t>(), r["one_stream_tps"].get<double>(),
                  r["many_streams_tps"].get<double>(), r["speedup"].get<double>());
    }
  }
  std::printf("| memory | KV bytes per token (%s) | %zu |\n", o.engine.kv_type.c_str(), per_token);
  std::printf("| memory | peak RSS / bound (file x 1.15 + KV budget (and spool buffers) %.0f MB + 200 MB) | %.0f / %.0f MB |\n",
              static_cast<double>(scenario.max_kv_budget()) / 1e6, rss, memory["peak_rss_bound_mb"].get<double>());
  return 0;
}

}  // namespace promptly::cli
