// The vLLM-style summary on a synthetic trace whose every statistic is worked out by hand.
#include "loadgen/metrics.h"

#include <gtest/gtest.h>

#include <cmath>

namespace promptly::loadgen {
namespace {

TEST(Percentile, InterpolatesBetweenClosestRanksAsNumpy) {
  const std::vector<double> v = {4, 1, 3, 2};  // unsorted on purpose
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4);
  EXPECT_NEAR(percentile(v, 99), 3.97, 1e-12);  // rank 0.99 * 3 = 2.97
  EXPECT_NEAR(percentile(v, 25), 1.75, 1e-12);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 99), 0);
}

RequestRecord ok(std::size_t prompt, std::size_t output, double ttft, double e2el, std::vector<double> itl) {
  RequestRecord r;
  r.success = true;
  r.prompt_tokens = prompt;
  r.output_tokens = output;
  r.ttft_s = ttft;
  r.e2el_s = e2el;
  r.itl_s = std::move(itl);
  return r;
}

// Three answers and one failure over 2 s:
//   A: 11 tokens, TTFT 100 ms, E2EL 1100 ms -> TPOT 1000 / 10 = 100 ms, ten gaps of 100 ms
//   B:  6 tokens, TTFT 200 ms, E2EL  700 ms -> TPOT  500 /  5 = 100 ms, gaps 50, 150, 100, 100, 100
//   C:  1 token,  TTFT 300 ms, E2EL  300 ms -> no TPOT (0 against the SLO), no gaps
std::vector<RequestRecord> trace() {
  RequestRecord failed;
  failed.error = "HTTP 500: boom";
  return {ok(10, 11, 0.1, 1.1, std::vector<double>(10, 0.1)), ok(20, 6, 0.2, 0.7, {0.05, 0.15, 0.1, 0.1, 0.1}), ok(30, 1, 0.3, 0.3, {}), failed};
}

TEST(Summary, CountsThroughputsAndLatenciesOfAKnownTrace) {
  const Summary s = summarize(trace(), 2.0, Slo{});
  EXPECT_EQ(s.completed, 3u);
  EXPECT_EQ(s.failed, 1u);
  EXPECT_EQ(s.total_input_tokens, 60u);
  EXPECT_EQ(s.total_output_tokens, 18u);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(s.output_throughput, 9.0);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 39.0);
  EXPECT_FALSE(s.request_goodput.has_value());

  EXPECT_NEAR(s.ttft.mean_ms, 200, 1e-9);
  EXPECT_NEAR(s.ttft.median_ms, 200, 1e-9);
  EXPECT_NEAR(s.ttft.std_ms, 1000 * std::sqrt(0.02 / 3), 1e-9);  // population deviation
  ASSERT_EQ(s.ttft.percentiles_ms.size(), 1u);
  EXPECT_EQ(s.ttft.percentiles_ms[0].first, 99);
  EXPECT_NEAR(s.ttft.percentiles_ms[0].second, 298, 1e-9);  // rank 1.98 between 200 and 300

  // C's single token leaves it out of TPOT: two values of 100 ms.
  EXPECT_NEAR(s.tpot.mean_ms, 100, 1e-9);
  EXPECT_NEAR(s.tpot.std_ms, 0, 1e-9);

  // 15 gaps: 50, thirteen of 100, 150; p99 at rank 13.86 between 100 and 150.
  EXPECT_NEAR(s.itl.mean_ms, 100, 1e-9);
  EXPECT_NEAR(s.itl.median_ms, 100, 1e-9);
  EXPECT_NEAR(s.itl.percentiles_ms[0].second, 143, 1e-9);

  EXPECT_NEAR(s.e2el.mean_ms, 700, 1e-9);
  EXPECT_NEAR(s.e2el.median_ms, 700, 1e-9);
  EXPECT_NEAR(s.e2el.percentiles_ms[0].second, 1092, 1e-9);  // rank 1.98 between 700 and 1100
}

TEST(Summary, GoodputCountsRequestsMeetingEverySlo) {
  Slo ttft;
  ttft.ttft_ms = 250;  // A and B
  EXPECT_DOUBLE_EQ(*summarize(trace(), 2.0, ttft).request_goodput, 1.0);
  Slo tpot;
  tpot.tpot_ms = 90;  // only C, whose one token has no time per token
  EXPECT_DOUBLE_EQ(*summarize(trace(), 2.0, tpot).request_goodput, 0.5);
  Slo both = ttft;
  both.tpot_ms = 90;  // nobody
  EXPECT_DOUBLE_EQ(*summarize(trace(), 2.0, both).request_goodput, 0.0);
  Slo e2el;
  e2el.e2el_ms = 700;  // B (exactly at the limit) and C
  EXPECT_DOUBLE_EQ(*summarize(trace(), 2.0, e2el).request_goodput, 1.0);
}

TEST(Summary, AllFailedGivesZerosNotNaN) {
  RequestRecord failed;
  failed.error = "connect: Connection refused";
  const Summary s = summarize({failed, failed}, 0.0, Slo{});
  EXPECT_EQ(s.completed, 0u);
  EXPECT_EQ(s.failed, 2u);
  const nlohmann::json j = summary_json(s);
  for (const auto& [key, value] : j.items()) {
    if (value.is_number_float()) {
      EXPECT_TRUE(std::isfinite(value.get<double>())) << key;
    }
  }
  EXPECT_EQ(j["request_throughput"], 0.0);
  EXPECT_EQ(j["p99_ttft_ms"], 0.0);
}

TEST(Summary, JsonUsesVllmFieldNames) {
  Slo slo;
  slo.ttft_ms = 250;
  const nlohmann::json j = summary_json(summarize(trace(), 2.0, slo, {90, 99, 99.9}));
  for (const char* key : {"duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
                          "output_throughput", "total_token_throughput"})
    EXPECT_TRUE(j.contains(key)) << key;
  for (const char* metric : {"ttft", "tpot", "itl", "e2el"})
    for (const char* stat : {"mean_", "median_", "std_", "p90_", "p99_", "p99.9_"})
      EXPECT_TRUE(j.contains(std::string(stat) + metric + "_ms")) << stat << metric;
  EXPECT_EQ(j["completed"], 3);
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), 1.0);
  EXPECT_NEAR(j["p99_itl_ms"].get<double>(), 143, 1e-9);
  EXPECT_TRUE(summary_json(summarize(trace(), 2.0, Slo{}))["request_goodput"].is_null());
}

}  // namespace
}  // namespace promptly::loadgen
