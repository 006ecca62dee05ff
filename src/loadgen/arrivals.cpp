#include "loadgen/arrivals.h"

#include <cmath>
#include <random>

#include "util/error.h"

namespace promptly::loadgen {

std::vector<double> arrival_times(std::size_t n, double rate, double burstiness, std::uint64_t seed) {
  if (!(rate > 0)) throw Error("request rate must be positive (or inf to send everything at once), got " + std::to_string(rate));
  if (!(burstiness > 0) || std::isinf(burstiness))
    throw Error("burstiness must be a positive number (1: Poisson arrivals), got " + std::to_string(burstiness));
  std::vector<double> times(n, 0.0);
  if (std::isinf(rate)) return times;
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  for (std::size_t i = 1; i < n; ++i) times[i] = times[i - 1] + gap(rng);
  return times;
}

std::vector<double> parse_rates(const std::string& text) {
  std::vector<double> rates;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    double rate = 0;
    if (item == "inf") {
      rate = kInfiniteRate;
    } else {
      std::size_t used = 0;
      try {
        rate = std::stod(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != item.size() || !(rate > 0) || std::isinf(rate))
        throw Error("--request-rate: '" + item + "' is not a positive number or inf (a sweep is a comma-separated list, e.g. 0.5,1,2,4)");
    }
    rates.push_back(rate);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return rates;
}

}  // namespace promptly::loadgen
