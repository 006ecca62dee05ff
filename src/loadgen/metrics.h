#pragma once
// What one benchmark run measured, per request and in summary. The summary follows vLLM's
// `bench serve` definitions and field names, so results can be compared with its reports and
// read by the same scripts:
//   TTFT  send -> first streamed chunk with text
//   ITL   gaps between consecutive chunks with text
//   TPOT  (E2EL - TTFT) / (output tokens - 1), per request (0 for one-token answers, kept for goodput)
//   E2EL  send -> end of the response
//   goodput  requests per second that met every SLO given
#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace promptly::loadgen {

struct RequestRecord {
  bool success = false;
  std::string error;           // why it failed, for the report (empty on success)
  std::size_t prompt_tokens = 0;  // the server's usage.prompt_tokens (0 when it reports none)
  std::size_t output_tokens = 0;  // usage.completion_tokens, else the number of chunks with text
  double ttft_s = 0;
  double e2el_s = 0;
  std::vector<double> itl_s;   // one per chunk with text after the first
  std::string generated_text;  // the answer, resent as history by multi-turn sessions
};

// Service-level objectives for goodput; an unset one is not checked.
struct Slo {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};

struct LatencySummary {
  double mean_ms = 0, median_ms = 0, std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (percentile, value), e.g. (99, 412.5)
};

struct Summary {
  double duration_s = 0;
  std::size_t completed = 0, failed = 0;
  std::size_t total_input_tokens = 0, total_output_tokens = 0;
  double request_throughput = 0, output_throughput = 0, total_token_throughput = 0;
  std::optional<double> request_goodput;  // only when an SLO was given
  LatencySummary ttft, tpot, itl, e2el;
};

// numpy.percentile's default (linear interpolation between closest ranks), which vLLM uses;
// `p` in [0, 100]. 0 for an empty sample, as vLLM reports it.
double percentile(std::vector<double> values, double p);

// The summary of a run that lasted `duration_s` (first send to last response), over every request
// sent or skipped. Latency statistics cover successful requests only; failed ones count in `failed`.
Summary summarize(const std::vector<RequestRecord>& records, double duration_s, const Slo& slo,
                  const std::vector<double>& percentiles = {99});

// The summary under vLLM's JSON keys (`completed`, `request_throughput`, `mean_ttft_ms`,
// `p99_itl_ms`, ...), `request_goodput` null without SLOs.
nlohmann::json summary_json(const Summary& s);

}  // namespace promptly::loadgen
