#include "loadgen/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

namespace promptly::loadgen {

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(values.size() - 1);
  const auto below = static_cast<std::size_t>(std::floor(rank));
  const std::size_t above = std::min(below + 1, values.size() - 1);
  return values[below] + (values[above] - values[below]) * (rank - static_cast<double>(below));
}

namespace {

LatencySummary latency_summary(const std::vector<double>& seconds, const std::vector<double>& percentiles) {
  LatencySummary s;
  if (!seconds.empty()) {
    const double n = static_cast<double>(seconds.size());
    const double mean = std::accumulate(seconds.begin(), seconds.end(), 0.0) / n;
    double sum_sq = 0;
    for (double x : seconds) sum_sq += (x - mean) * (x - mean);
    s.mean_ms = mean * 1000;
    s.std_ms = std::sqrt(sum_sq / n) * 1000;  // population deviation, as numpy.std (and so vLLM)
    s.median_ms = percentile(seconds, 50) * 1000;
  }
  for (double p : percentiles) s.percentiles_ms.emplace_back(p, percentile(seconds, p) * 1000);
  return s;
}

// "99" for 99, "99.9" for 99.9: vLLM's key spelling (p99_ttft_ms, p99.9_ttft_ms).
std::string percentile_key(double p) {
  std::ostringstream out;
  out << p;
  return out.str();
}

}  // namespace

Summary summarize(const std::vector<RequestRecord>& records, double duration_s, const Slo& slo, const std::vector<double>& percentiles) {
  Summary s;
  s.duration_s = duration_s;
  std::vector<double> ttfts, tpots, itls, e2els;
  std::size_t good = 0;
  for (const RequestRecord& r : records) {
    if (!r.success) {
      ++s.failed;
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.prompt_tokens;
    s.total_output_tokens += r.output_tokens;
    // A one-token answer has no time per output token: it is left out of the TPOT statistics but
    // counts as 0 against the TPOT SLO, as in vLLM.
    double tpot = 0;
    if (r.output_tokens > 1) {
      tpot = (r.e2el_s - r.ttft_s) / static_cast<double>(r.output_tokens - 1);
      tpots.push_back(tpot);
    }
    ttfts.push_back(r.ttft_s);
    e2els.push_back(r.e2el_s);
    itls.insert(itls.end(), r.itl_s.begin(), r.itl_s.end());
    const bool meets = (!slo.ttft_ms || r.ttft_s * 1000 <= *slo.ttft_ms) && (!slo.tpot_ms || tpot * 1000 <= *slo.tpot_ms) &&
                       (!slo.e2el_ms || r.e2el_s * 1000 <= *slo.e2el_ms);
    if (meets) ++good;
  }
  const double per_s = duration_s > 0 ? 1.0 / duration_s : 0.0;
  s.request_throughput = static_cast<double>(s.completed) * per_s;
  s.output_throughput = static_cast<double>(s.total_output_tokens) * per_s;
  s.total_token_throughput = static_cast<double>(s.total_input_tokens + s.total_output_tokens) * per_s;
  if (slo.any()) s.request_goodput = static_cast<double>(good) * per_s;
  s.ttft = latency_summary(ttfts, percentiles);
  s.tpot = latency_summary(tpots, percentiles);
  s.itl = latency_summary(itls, percentiles);
  s.e2el = latency_summary(e2els, percentiles);
  return s;
}

nlohmann::json summary_json(const Summary& s) {
  nlohmann::json j = {
      {"duration", s.duration_s},
      {"completed", s.completed},
      {"failed", s.failed},
      {"total_input_tokens", s.total_input_tokens},
      {"total_output_tokens", s.total_output_tokens},
      {"request_throughput", s.request_throughput},
      {"request_goodput", s.request_goodput ? nlohmann::json(*s.request_goodput) : nlohmann::json(nullptr)},
      {"output_throughput", s.output_throughput},
      {"total_token_throughput", s.total_token_throughput},
  };
  const std::pair<const char*, const LatencySummary*> metrics[] = {{"ttft", &s.ttft}, {"tpot", &s.tpot}, {"itl", &s.itl}, {"e2el", &s.e2el}};
  for (const auto& [name, m] : metrics) {
    const std::string n = name;
    j["mean_" + n + "_ms"] = m->mean_ms;
    j["median_" + n + "_ms"] = m->median_ms;
    j["std_" + n + "_ms"] = m->std_ms;
    for (const auto& [p, value] : m->percentiles_ms) j["p" + percentile_key(p) + "_" + n + "_ms"] = value;
  }
  return j;
}

}  // namespace promptly::loadgen
