#include "backend/cuda/step_profile.h"

#include <algorithm>
#include <cstdio>

#include "backend/cuda/check.h"

namespace promptly::backend::cuda {

StepProfile::~StepProfile() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void StepProfile::begin(cudaStream_t stream, bool decode) {
  if (!on_) return;
  stream_ = stream;
  decode_ = decode;
  names_.clear();
  bytes_.clear();
}

void StepProfile::mark(const char* name, double weight_bytes) {
  if (!on_) return;
  if (names_.size() + 1 >= events_.size()) {  // one more for the end
    events_.resize(names_.size() + 2, nullptr);
    for (cudaEvent_t& e : events_) {
      if (!e) PROMPTLY_CUDA_CHECK(cudaEventCreate(&e));
    }
  }
  PROMPTLY_CUDA_CHECK(cudaEventRecord(events_[names_.size()], stream_));
  names_.push_back(name);
  bytes_.push_back(weight_bytes);
}

void StepProfile::end(bool finished) {
  if (!on_ || names_.empty()) return;
  PROMPTLY_CUDA_CHECK(cudaEventRecord(events_[names_.size()], stream_));
  PROMPTLY_CUDA_CHECK(cudaEventSynchronize(events_[names_.size()]));
  if (!finished) return;
  Totals& totals = decode_ ? decode_totals_ : prefill_totals_;
  for (std::size_t i = 0; i < names_.size(); ++i) {
    float ms = 0.0f;
    PROMPTLY_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    totals.ms[names_[i]] += ms;
    totals.bytes[names_[i]] += bytes_[i];
  }
  ++totals.passes;
}

std::string StepProfile::report() const {
  std::string out;
  for (const auto& [kind, totals] : {std::pair{"decode", &decode_totals_}, std::pair{"prefill", &prefill_totals_}}) {
    if (totals->passes == 0) continue;
    std::vector<std::pair<double, std::string>> rows;
    double sum = 0;
    for (const auto& [name, ms] : totals->ms) {
      rows.emplace_back(ms / totals->passes, name);
      sum += ms / totals->passes;
    }
    std::sort(rows.rbegin(), rows.rend());
    char line[160];
    std::snprintf(line, sizeof line, "GPU profile, %s passes (%d, graphs off): %.3f ms a pass\n", kind, totals->passes, sum);
    out += line;
    for (const auto& [ms, name] : rows) {
      const auto bytes = totals->bytes.find(name);
      const double per_pass = bytes == totals->bytes.end() ? 0.0 : bytes->second / totals->passes;
      const int n = std::snprintf(line, sizeof line, "  %-34s %9.3f ms %5.1f%%", name.c_str(), ms, sum > 0 ? 100.0 * ms / sum : 0.0);
      if (per_pass > 0 && ms > 0 && n > 0) std::snprintf(line + n, sizeof line - n, "  %8.1f GB/s of weights", per_pass / (ms / 1e3) / 1e9);
      out += line;
      out += '\n';
    }
  }
  return out;
}

}  // namespace promptly::backend::cuda
