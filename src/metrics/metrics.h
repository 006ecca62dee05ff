#pragma once
// Counters, gauges and histograms with the Prometheus text exposition format. Small and
// hand-written: the three metric kinds and one output format are all a server needs, and a client
// library would bring its own HTTP exposer and threading model. Updates are thread-safe and cheap
// (an atomic add, or a short lock for histograms); render() takes a consistent snapshot per metric.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace promptly::metrics {

class Counter {
 public:
  void add(double v = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // sorted, without +Inf
  void observe(double v);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<std::uint64_t> cumulative;  // per bound, then +Inf
    double sum = 0;
    std::uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<std::uint64_t> counts_;  // per bucket, +Inf last
  double sum_ = 0;
  std::uint64_t count_ = 0;
};

// A set of named metrics rendered together. Names get the registry's prefix ("promptly:").
class Registry {
 public:
  explicit Registry(std::string prefix) : prefix_(std::move(prefix)) {}

  // `labels` is the Prometheus label set without braces, e.g. finished_reason="stop"; metrics
  // registered under one name with different labels share HELP/TYPE lines.
  Counter& counter(const std::string& name, const std::string& help, const std::string& labels = "");
  Histogram& histogram(const std::string& name, const std::string& help, std::vector<double> upper_bounds);
  // Gauges (and counters kept elsewhere, e.g. by the engine) are read when rendered, so they never
  // go stale.
  void gauge(const std::string& name, const std::string& help, std::function<double()> read);
  // A gauge that may have no value (e.g. a GPU statistic while the driver cannot say): left out of
  // the output, HELP and TYPE included, whenever `read` returns nullopt.
  void gauge_if_known(const std::string& name, const std::string& help, std::function<std::optional<double>()> read);
  void counter_fn(const std::string& name, const std::string& help, std::function<double()> read, const std::string& labels = "");

  std::string render() const;

 private:
  struct Entry {
    std::string name, help, type, labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Histogram> histogram;
    std::function<double()> gauge;
    std::function<std::optional<double>()> gauge_if_known;
  };
  Entry& add(const std::string& name, const std::string& help, const char* type, const std::string& labels);

  std::string prefix_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Entry>> entries_;
};

// Latency buckets in seconds, from 1 ms to 5 minutes.
std::vector<double> latency_buckets();

}  // namespace promptly::metrics
