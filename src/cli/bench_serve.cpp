// `promptly bench serve`: load on a running OpenAI-compatible server, measured from the client.
// Exit status: 0 when every request succeeded, 2 when any failed (the report and --json are still
// written, the failures counted and their errors listed), 1 for bad input (CLI11 uses its own codes
// for malformed flags).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "loadgen/arrivals.h"
#include "loadgen/client.h"
#include "loadgen/datasets.h"
#include "loadgen/metrics.h"
#include "loadgen/runner.h"
#include "loadgen/svg_plot.h"
#include "util/clock.h"
#include "util/error.h"

namespace promptly::cli {
namespace {

using loadgen::Summary;

std::string rate_text(double rate) {
  if (std::isinf(rate)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", rate);
  return buf;
}

// A bar on stderr, redrawn in place on a terminal; in a log, a line every tenth of the run.
class ProgressBar {
 public:
  explicit ProgressBar(std::string label) : label_(std::move(label)), tty_(::isatty(STDERR_FILENO) == 1), start_(SteadyClock::now()) {}

  void update(std::size_t done, std::size_t failed, std::size_t total) {
    const bool last = done == total;
    if (tty_) {
      const double now = seconds_since(start_);
      if (!last && now - drawn_at_ < 0.1) return;
      drawn_at_ = now;
    } else {
      const std::size_t tenth = total ? done * 10 / total : 10;
      if (!last && tenth == printed_tenth_) return;
      printed_tenth_ = tenth;
    }
    constexpr int kWidth = 30;
    const int filled = total ? static_cast<int>(kWidth * done / total) : kWidth;
    std::fprintf(stderr, "%s%s [%.*s%*s] %zu/%zu, %zu failed, %.1f s%s", tty_ ? "\r" : "", label_.c_str(), filled,
                 "==============================", kWidth - filled, "", done, total, failed, seconds_since(start_), tty_ && !last ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  std::string label_;
  bool tty_;
  SteadyClock::time_point start_;
  double drawn_at_ = -1;
  std::size_t printed_tenth_ = static_cast<std::size_t>(-1);
};

// The model to name in requests: the one asked for, else the first the server lists; empty when
// the server cannot say (its requests will then show why they fail, or succeed without a name).
std::string pick_model(loadgen::HttpClient& client, const std::string& asked) {
  if (!asked.empty()) return asked;
  std::string error;
  const auto body = client.get("/v1/models", error);
  if (body) {
    const nlohmann::json j = nlohmann::json::parse(*body, nullptr, false);
    if (!j.is_discarded() && j.contains("data") && j["data"].is_array() && !j["data"].empty() && j["data"][0].contains("id") &&
        j["data"][0]["id"].is_string())
      return j["data"][0]["id"].get<std::string>();
    error = "/v1/models lists no model";
  }
  std::fprintf(stderr, "warning: could not learn the model name (%s); requests go without one (--model names it)\n", error.c_str());
  return "";
}

void print_summary(const Summary& s, double rate) {
  std::printf("request rate %s: %zu completed, %zu failed in %.2f s; %.2f req/s, %.1f output tok/s, %.1f total tok/s", rate_text(rate).c_str(),
              s.completed, s.failed, s.duration_s, s.request_throughput, s.output_throughput, s.total_token_throughput);
  if (s.request_goodput) std::printf(", goodput %.2f req/s", *s.request_goodput);
  std::printf("\ntokens: %zu input (server's count), %zu output\n\n", s.total_input_tokens, s.total_output_tokens);
  std::printf("| ms | mean | median | p99 | std |\n|---|---|---|---|---|\n");
  const std::pair<const char*, const loadgen::LatencySummary*> rows[] = {{"TTFT", &s.ttft}, {"TPOT", &s.tpot}, {"ITL", &s.itl}, {"E2EL", &s.e2el}};
  for (const auto& [name, m] : rows)
    std::printf("| %s | %.2f | %.2f | %.2f | %.2f |\n", name, m->mean_ms, m->median_ms, m->percentiles_ms.empty() ? 0.0 : m->percentiles_ms[0].second,
                m->std_ms);
  std::printf("\n");
}

// The distinct errors with their counts, most frequent first, so a broken run says why at once.
void print_errors(const std::vector<loadgen::RequestRecord>& records) {
  std::map<std::string, std::size_t> counts;
  for (const auto& r : records)
    if (!r.success) ++counts[r.error];
  std::vector<std::pair<std::size_t, std::string>> sorted;
  for (const auto& [error, n] : counts) sorted.emplace_back(n, error);
  std::sort(sorted.rbegin(), sorted.rend());
  for (std::size_t i = 0; i < sorted.size() && i < 5; ++i) std::fprintf(stderr, "failed x%zu: %s\n", sorted[i].first, sorted[i].second.c_str());
  if (sorted.size() > 5) std::fprintf(stderr, "... and %zu other errors (all of them in --json's \"errors\")\n", sorted.size() - 5);
}

nlohmann::json run_json(const BenchServeOptions& o, const std::string& model, double rate, const Summary& s,
                        const std::vector<loadgen::RequestRecord>& records) {
  nlohmann::json j = {{"url", o.url},
                      {"api", o.api},
                      {"model", model},
                      {"dataset", o.dataset},
                      {"num_prompts", o.num_prompts},
                      {"request_rate", std::isinf(rate) ? nlohmann::json("inf") : nlohmann::json(rate)},
                      {"burstiness", o.burstiness},
                      {"max_concurrency", o.max_concurrency ? nlohmann::json(o.max_concurrency) : nlohmann::json(nullptr)}};
  nlohmann::json slo = nlohmann::json::object();
  if (o.slo_ttft_ms) slo["ttft_ms"] = *o.slo_ttft_ms;
  if (o.slo_tpot_ms) slo["tpot_ms"] = *o.slo_tpot_ms;
  if (o.slo_e2el_ms) slo["e2el_ms"] = *o.slo_e2el_ms;
  j["slo"] = slo;
  j.update(loadgen::summary_json(s));
  // Per request, in the order they ended, as vLLM's result file lists them.
  nlohmann::json input_lens = nlohmann::json::array(), output_lens = nlohmann::json::array(), ttfts = nlohmann::json::array(),
                 e2els = nlohmann::json::array(), itls = nlohmann::json::array(), errors = nlohmann::json::array();
  for (const auto& r : records) {
    input_lens.push_back(r.prompt_tokens);
    output_lens.push_back(r.success ? r.output_tokens : 0);
    ttfts.push_back(r.ttft_s);
    e2els.push_back(r.e2el_s);
    itls.push_back(r.itl_s);
    errors.push_back(r.error);
  }
  j["input_lens"] = input_lens;
  j["output_lens"] = output_lens;
  j["ttfts"] = ttfts;
  j["e2els"] = e2els;
  j["itls"] = itls;
  j["errors"] = errors;
  return j;
}

void write_text(const std::string& path, const std::string& text, const char* what) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw Error("cannot write the " + std::string(what) + " to " + path);
}

// Every request in flight holds a socket, and `--request-rate inf` without --max-concurrency opens
// them all at once: lift the soft limit on open files to the hard one so that a run of a few
// thousand prompts measures the server rather than this process's default of 1024.
void raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

int bench_serve(const BenchServeOptions& o) {
  const std::vector<double> rates = loadgen::parse_rates(o.request_rate);
  if (!o.plot_file.empty())
    for (double r : rates)
      if (std::isinf(r)) throw Error("--plot draws latency against a finite request rate; leave inf out of the sweep (or drop --plot)");
  if (!(o.burstiness > 0)) throw Error("--burstiness must be positive (1: Poisson arrivals)");
  loadgen::DatasetOptions d;
  d.name = o.dataset;
  d.num_prompts = o.num_prompts;
  d.input_len = o.input_len;
  d.output_len = o.output_len;
  d.turns = o.turns;
  d.seed = o.seed;
  const std::vector<loadgen::Session> sessions = loadgen::make_dataset(d);
  std::size_t requests = 0;
  for (const auto& s : sessions) requests += s.turns.size();

  raise_open_file_limit();
  boost::asio::io_context io;
  loadgen::HttpClient client(io, loadgen::parse_url(o.url), o.api_key, o.timeout_s);
  loadgen::RunConfig config;
  config.api = o.api == "completions" ? loadgen::Api::Completions : loadgen::Api::Chat;
  config.model = pick_model(client, o.model);
  config.burstiness = o.burstiness;
  config.max_concurrency = o.max_concurrency;
  config.think_ms = o.think_ms;
  config.ignore_eos = o.ignore_eos;
  config.seed = o.seed;
  const loadgen::Slo slo{o.slo_ttft_ms, o.slo_tpot_ms, o.slo_e2el_ms};

  std::fprintf(stderr, "bench serve: %s, model %s, %s: %zu conversations, %zu requests\n", o.url.c_str(),
               config.model.empty() ? "(none named)" : config.model.c_str(), o.dataset.c_str(), sessions.size(), requests);
  std::vector<Summary> summaries;
  nlohmann::json runs = nlohmann::json::array();
  bool any_failed = false;
  for (double rate : rates) {
    config.request_rate = rate;
    ProgressBar bar("rate " + rate_text(rate));
    const loadgen::RunResult result =
        loadgen::run_benchmark(io, client, sessions, config, [&](std::size_t done, std::size_t failed, std::size_t total) { bar.update(done, failed, total); });
    const Summary s = loadgen::summarize(result.records, result.duration_s, slo);
    print_summary(s, rate);
    if (s.failed) {
      any_failed = true;
      print_errors(result.records);
    }
    summaries.push_back(s);
    runs.push_back(run_json(o, config.model, rate, s, result.records));
  }
  if (rates.size() > 1) {
    std::printf("| request rate | completed | failed | req/s | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p99 ms | goodput req/s |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|\n");
    for (std::size_t i = 0; i < rates.size(); ++i) {
      const Summary& s = summaries[i];
      std::printf("| %s | %zu | %zu | %.2f | %.1f | %.1f | %.1f | %.1f | %s |\n", rate_text(rates[i]).c_str(), s.completed, s.failed,
                  s.request_throughput, s.output_throughput, s.ttft.median_ms, s.ttft.percentiles_ms[0].second, s.itl.percentiles_ms[0].second,
                  s.request_goodput ? std::to_string(*s.request_goodput).c_str() : "-");
    }
  }
  if (!o.json_file.empty()) write_text(o.json_file, (rates.size() == 1 ? runs[0] : nlohmann::json{{"sweep", runs}}).dump(2) + "\n", "results");
  if (!o.plot_file.empty()) {
    loadgen::PlotSeries ttft50{"TTFT p50", {}}, ttft99{"TTFT p99", {}}, itl99{"ITL p99", {}};
    for (const Summary& s : summaries) {
      ttft50.y.push_back(s.ttft.median_ms);
      ttft99.y.push_back(s.ttft.percentiles_ms[0].second);
      itl99.y.push_back(s.itl.percentiles_ms[0].second);
    }
    write_text(o.plot_file,
               loadgen::line_chart_svg("Latency against request rate (" + o.dataset + ")", "request rate (conversations/s)", "ms", rates,
                                       {ttft50, ttft99, itl99}),
               "plot");
  }
  return any_failed ? 2 : 0;
}

}  // namespace promptly::cli
