#pragma once
// A small self-contained SVG line chart, for the request-rate sweep of `bench serve` (no plotting
// library on the machines that run benchmarks).
#include <string>
#include <vector>

namespace promptly::loadgen {

struct PlotSeries {
  std::string label;
  std::vector<double> y;  // one value per x
};

// Lines through (x[i], series.y[i]) with axes, ticks and a legend. Throws Error when a series'
// length differs from x's or x is empty.
std::string line_chart_svg(const std::string& title, const std::string& x_label, const std::string& y_label, const std::vector<double>& x,
                           const std::vector<PlotSeries>& series);

}  // namespace promptly::loadgen
