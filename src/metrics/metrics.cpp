#include "metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace promptly::metrics {

void Counter::add(double v) {
  double cur = value_.load(std::memory_order_relaxed);
  while (!value_.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
}

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {
  std::sort(bounds_.begin(), bounds_.end());
}

void Histogram::observe(double v) {
  const std::size_t bucket = static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  std::lock_guard lock(mutex_);
  std::uint64_t running = 0;
  for (std::uint64_t c : counts_) s.cumulative.push_back(running += c);
  s.sum = sum_;
  s.count = count_;
  return s;
}

Registry::Entry& Registry::add(const std::string& name, const std::string& help, const char* type, const std::string& labels) {
  auto e = std::make_unique<Entry>();
  e->name = prefix_ + name;
  e->help = help;
  e->type = type;
  e->labels = labels;
  entries_.push_back(std::move(e));
  return *entries_.back();
}

Counter& Registry::counter(const std::string& name, const std::string& help, const std::string& labels) {
  std::lock_guard lock(mutex_);
  Entry& e = add(name, help, "counter", labels);
  e.counter = std::make_unique<Counter>();
  return *e.counter;
}

Histogram& Registry::histogram(const std::string& name, const std::string& help, std::vector<double> upper_bounds) {
  std::lock_guard lock(mutex_);
  Entry& e = add(name, help, "histogram", "");
  e.histogram = std::make_unique<Histogram>(std::move(upper_bounds));
  return *e.histogram;
}

void Registry::gauge(const std::string& name, const std::string& help, std::function<double()> read) {
  std::lock_guard lock(mutex_);
  add(name, help, "gauge", "").gauge = std::move(read);
}

void Registry::gauge_if_known(const std::string& name, const std::string& help, std::function<std::optional<double>()> read) {
  std::lock_guard lock(mutex_);
  add(name, help, "gauge", "").gauge_if_known = std::move(read);
}

void Registry::counter_fn(const std::string& name, const std::string& help, std::function<double()> read, const std::string& labels) {
  std::lock_guard lock(mutex_);
  add(name, help, "counter", labels).gauge = std::move(read);
}

namespace {
std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}
}  // namespace

std::string Registry::render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  std::string last_name;
  for (const auto& e : entries_) {
    const std::optional<double> known = e->gauge_if_known ? e->gauge_if_known() : std::nullopt;
    if (e->gauge_if_known && !known) continue;  // no value now: no sample, and no HELP/TYPE without one
    if (e->name != last_name) {
      out += "# HELP " + e->name + " " + e->help + "\n# TYPE " + e->name + " " + e->type + "\n";
      last_name = e->name;
    }
    const std::string braces = e->labels.empty() ? "" : "{" + e->labels + "}";
    if (e->counter) {
      out += e->name + braces + " " + number(e->counter->value()) + "\n";
    } else if (e->gauge) {
      out += e->name + braces + " " + number(e->gauge()) + "\n";
    } else if (known) {
      out += e->name + braces + " " + number(*known) + "\n";
    } else if (e->histogram) {
      const Histogram::Snapshot s = e->histogram->snapshot();
      const std::string sep = e->labels.empty() ? "" : e->labels + ",";
      for (std::size_t i = 0; i < s.bounds.size(); ++i) {
        out += e->name + "_bucket{" + sep + "le=\"" + number(s.bounds[i]) + "\"} " + std::to_string(s.cumulative[i]) + "\n";
      }
      out += e->name + "_bucket{" + sep + "le=\"+Inf\"} " + std::to_string(s.cumulative.back()) + "\n";
      out += e->name + "_sum" + braces + " " + number(s.sum) + "\n";
      out += e->name + "_count" + braces + " " + std::to_string(s.count) + "\n";
    }
  }
  return out;
}

std::vector<double> latency_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0};
}

}  // namespace promptly::metrics
