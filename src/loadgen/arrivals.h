#pragma once
// When each request (or multi-turn session) of an open-loop benchmark is sent, as in vLLM's
// `bench serve`: gaps drawn from a gamma distribution with shape = burstiness and
// scale = 1 / (rate * burstiness), so the mean rate is `rate` whatever the burstiness; burstiness 1
// is a Poisson process (exponential gaps), below 1 burstier, above 1 more regular.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace promptly::loadgen {

inline constexpr double kInfiniteRate = std::numeric_limits<double>::infinity();

// Seconds after the start at which each of `n` requests is sent; the first goes at 0. An infinite
// rate sends them all at 0. Throws Error for a rate or burstiness that is not positive.
std::vector<double> arrival_times(std::size_t n, double rate, double burstiness, std::uint64_t seed);

// "0.5,1,2,inf" -> {0.5, 1, 2, inf}; throws Error naming the bad item.
std::vector<double> parse_rates(const std::string& text);

}  // namespace promptly::loadgen
