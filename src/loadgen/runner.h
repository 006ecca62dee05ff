#pragma once
// One open-loop benchmark run against an OpenAI-compatible server: sessions start at their arrival
// times, each turn is one streamed request, a session's next turn follows its previous answer
// after a think time, and at most `max_concurrency` requests are in flight (the rest wait in
// arrival order). Everything runs on the calling thread's io_context.
#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loadgen/client.h"
#include "loadgen/datasets.h"
#include "loadgen/metrics.h"

namespace promptly::loadgen {

enum class Api { Chat, Completions };

struct RunConfig {
  Api api = Api::Chat;
  std::string model;                // empty: no model field (servers with one model accept that)
  double request_rate = 0;          // sessions per second; infinity: all at once
  double burstiness = 1;
  std::size_t max_concurrency = 0;  // 0: no limit
  double think_ms = 0;              // mean of the exponential pause before a session's next turn
  bool ignore_eos = false;          // ask for exactly max_tokens (a llama.cpp/vLLM/Promptly extension)
  std::uint64_t seed = 0;
};

struct RunResult {
  std::vector<RequestRecord> records;  // in the order the requests ended (skipped turns included)
  double duration_s = 0;               // first send to the last answer's end
};

// The JSON body of `session`'s turn `turn`, with the server's earlier `answers` as the history.
std::string request_body(const RunConfig& config, const Session& session, const std::vector<std::string>& answers, std::size_t turn);

// `progress(done, failed, total)` is called after every request ends.
RunResult run_benchmark(boost::asio::io_context& io, HttpClient& client, const std::vector<Session>& sessions, const RunConfig& config,
                        const std::function<void(std::size_t, std::size_t, std::size_t)>& progress);

}  // namespace promptly::loadgen
