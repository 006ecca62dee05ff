#pragma once
// Summary statistics of a benchmark's repeated measurements (the bench commands report medians:
// the machine is shared and noisy).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace promptly::cli {

struct Stats {
  double mean = 0, stddev = 0, median = 0;
};

inline Stats stats(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  for (double x : v) s.stddev += (x - s.mean) * (x - s.mean);
  s.stddev = v.size() > 1 ? std::sqrt(s.stddev / static_cast<double>(v.size() - 1)) : 0.0;
  std::sort(v.begin(), v.end());
  s.median = v[v.size() / 2];
  return s;
}

}  // namespace promptly::cli
