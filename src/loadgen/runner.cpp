#include "loadgen/runner.h"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "loadgen/arrivals.h"
#include "loadgen/sse.h"
#include "util/clock.h"

namespace promptly::loadgen {

namespace asio = boost::asio;

std::string request_body(const RunConfig& config, const Session& session, const std::vector<std::string>& answers, std::size_t turn) {
  nlohmann::json body;
  if (!config.model.empty()) body["model"] = config.model;
  if (config.api == Api::Chat) {
    nlohmann::json messages = nlohmann::json::array();
    if (!session.system.empty()) messages.push_back({{"role", "system"}, {"content", session.system}});
    for (std::size_t t = 0; t < turn; ++t) {
      messages.push_back({{"role", "user"}, {"content", session.turns[t].user}});
      messages.push_back({{"role", "assistant"}, {"content", answers.at(t)}});
    }
    messages.push_back({{"role", "user"}, {"content", session.turns[turn].user}});
    body["messages"] = std::move(messages);
  } else {
    // The completions API has no roles: the history is the text itself, paragraph by paragraph.
    std::string prompt = session.system;
    auto append = [&](const std::string& part) {
      if (!prompt.empty()) prompt += "\n\n";
      prompt += part;
    };
    for (std::size_t t = 0; t < turn; ++t) {
      append(session.turns[t].user);
      append(answers.at(t));
    }
    append(session.turns[turn].user);
    body["prompt"] = std::move(prompt);
  }
  body["max_tokens"] = session.turns[turn].max_tokens;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (config.ignore_eos) body["ignore_eos"] = true;
  return body.dump();
}

namespace {

// What one request in flight has seen so far.
struct InFlight {
  SteadyClock::time_point sent, last_text;
  bool got_text = false, done = false, finished = false;
  std::size_t text_chunks = 0;
  std::string stream_error;
  RequestRecord record;
};

class Run {
 public:
  Run(asio::io_context& io, HttpClient& client, const std::vector<Session>& sessions, const RunConfig& config,
      const std::function<void(std::size_t, std::size_t, std::size_t)>& progress)
      : io_(io), client_(client), sessions_(sessions), config_(config), progress_(progress), answers_(sessions.size()), think_rng_(config.seed + 1) {
    for (const Session& s : sessions) total_ += s.turns.size();
  }

  RunResult go() {
    const std::vector<double> arrivals = arrival_times(sessions_.size(), config_.request_rate, config_.burstiness, config_.seed);
    start_ = SteadyClock::now();
    last_end_ = start_;
    for (std::size_t i = 0; i < sessions_.size(); ++i) {
      if (arrivals[i] <= 0) {
        ready_.emplace_back(i, 0);
        continue;
      }
      after(start_ + std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(arrivals[i])), [this, i] {
        ready_.emplace_back(i, 0);
        pump();
      });
    }
    asio::post(io_, [this] { pump(); });
    io_.restart();
    io_.run();
    RunResult result;
    result.records = std::move(records_);
    result.duration_s = std::chrono::duration<double>(last_end_ - start_).count();
    return result;
  }

 private:
  template <typename F>
  void after(SteadyClock::time_point when, F f) {
    auto timer = std::make_shared<asio::steady_timer>(io_, when);
    timer->async_wait([timer, f = std::move(f)](const boost::system::error_code& ec) {
      if (!ec) f();
    });
  }

  void pump() {
    while (!ready_.empty() && (config_.max_concurrency == 0 || in_flight_ < config_.max_concurrency)) {
      const auto [session, turn] = ready_.front();
      ready_.pop_front();
      launch(session, turn);
    }
  }

  void launch(std::size_t session, std::size_t turn) {
    auto state = std::make_shared<InFlight>();
    const std::string body = request_body(config_, sessions_[session], answers_[session], turn);
    const std::string path = config_.api == Api::Chat ? "/v1/chat/completions" : "/v1/completions";
    ++in_flight_;
    state->sent = SteadyClock::now();
    client_.post_stream(
        path, body, [state](std::string_view data) { on_event(*state, data); },
        [this, state, session, turn](const StreamEnd& end) { on_end(*state, end, session, turn); });
  }

  static void on_event(InFlight& s, std::string_view data) {
    const auto now = SteadyClock::now();
    const StreamChunk chunk = parse_stream_chunk(data);
    if (!chunk.error.empty() && s.stream_error.empty()) s.stream_error = chunk.error;
    s.done = s.done || chunk.done;
    s.finished = s.finished || chunk.finished;
    if (chunk.prompt_tokens) s.record.prompt_tokens = *chunk.prompt_tokens;
    if (chunk.completion_tokens) s.record.output_tokens = *chunk.completion_tokens;
    if (chunk.text.empty()) return;
    if (!s.got_text) {
      s.record.ttft_s = std::chrono::duration<double>(now - s.sent).count();
      s.got_text = true;
    } else {
      s.record.itl_s.push_back(std::chrono::duration<double>(now - s.last_text).count());
    }
    s.last_text = now;
    ++s.text_chunks;
    s.record.generated_text += chunk.text;
  }

  void on_end(InFlight& s, const StreamEnd& end, std::size_t session, std::size_t turn) {
    const auto now = SteadyClock::now();
    --in_flight_;
    last_end_ = std::max(last_end_, now);
    RequestRecord record = std::move(s.record);
    record.e2el_s = std::chrono::duration<double>(now - s.sent).count();
    if (!end.error.empty()) record.error = end.error;
    else if (!s.stream_error.empty()) record.error = "error in the stream: " + s.stream_error;
    else if (!s.done && !s.finished) record.error = "the stream ended without a finish_reason or [DONE]";
    else if (!s.got_text) record.error = "the answer streamed no text";
    record.success = record.error.empty();
    // Servers that send no usage: each chunk with text counts as one token.
    if (record.success && record.output_tokens == 0) record.output_tokens = s.text_chunks;
    const bool success = record.success;
    std::string answer = record.generated_text;
    finish(std::move(record));
    const Session& conversation = sessions_[session];
    if (success && turn + 1 < conversation.turns.size()) {
      answers_[session].push_back(std::move(answer));
      const double think_s = config_.think_ms > 0 ? std::exponential_distribution<double>(1000.0 / config_.think_ms)(think_rng_) : 0.0;
      after(now + std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(think_s)), [this, session, turn] {
        ready_.emplace_back(session, turn + 1);
        pump();
      });
    } else if (!success) {
      // The rest of a broken conversation is never sent; it still counts, so that completed +
      // failed is always every request the dataset holds.
      for (std::size_t t = turn + 1; t < conversation.turns.size(); ++t) {
        RequestRecord skipped;
        skipped.error = "not sent: an earlier turn of its conversation failed";
        finish(std::move(skipped));
      }
    }
    pump();
  }

  void finish(RequestRecord record) {
    if (!record.success) ++failed_;
    records_.push_back(std::move(record));
    if (progress_) progress_(records_.size(), failed_, total_);
  }

  asio::io_context& io_;
  HttpClient& client_;
  const std::vector<Session>& sessions_;
  const RunConfig& config_;
  const std::function<void(std::size_t, std::size_t, std::size_t)>& progress_;
  std::vector<std::vector<std::string>> answers_;  // per session, the server's answers so far
  std::mt19937_64 think_rng_;
  std::deque<std::pair<std::size_t, std::size_t>> ready_;  // (session, turn) due to be sent
  std::size_t in_flight_ = 0, failed_ = 0, total_ = 0;
  std::vector<RequestRecord> records_;
  SteadyClock::time_point start_, last_end_;
};

}  // namespace

RunResult run_benchmark(asio::io_context& io, HttpClient& client, const std::vector<Session>& sessions, const RunConfig& config,
                        const std::function<void(std::size_t, std::size_t, std::size_t)>& progress) {
  return Run(io, client, sessions, config, progress).go();
}

}  // namespace promptly::loadgen
