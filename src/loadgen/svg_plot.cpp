#include "loadgen/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "util/error.h"

namespace promptly::loadgen {

namespace {

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// Tick step of 1, 2 or 5 times a power of ten giving about five ticks over [0, top].
double tick_step(double top) {
  const double raw = top / 5;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * magnitude) return m * magnitude;
  return 10 * magnitude;
}

}  // namespace

std::string line_chart_svg(const std::string& title, const std::string& x_label, const std::string& y_label, const std::vector<double>& x,
                           const std::vector<PlotSeries>& series) {
  if (x.empty()) throw Error("a chart needs at least one point");
  for (const PlotSeries& s : series)
    if (s.y.size() != x.size()) throw Error("chart series '" + s.label + "' has " + std::to_string(s.y.size()) + " values for " + std::to_string(x.size()) + " x values");
  constexpr double kWidth = 720, kHeight = 440, kLeft = 80, kRight = 170, kTop = 50, kBottom = 60;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  // Both axes start at 0: latency and rate are read as proportions.
  double x_max = 0, y_max = 0;
  for (double v : x)
    if (std::isfinite(v)) x_max = std::max(x_max, v);
  for (const PlotSeries& s : series)
    for (double v : s.y)
      if (std::isfinite(v)) y_max = std::max(y_max, v);
  const double x_step = tick_step(x_max > 0 ? x_max : 1), y_step = tick_step(y_max > 0 ? y_max : 1);
  const double x_top = std::ceil((x_max > 0 ? x_max : 1) / x_step) * x_step, y_top = std::ceil((y_max > 0 ? y_max : 1) / y_step) * y_step;
  auto px = [&](double v) { return kLeft + v / x_top * plot_w; };
  auto py = [&](double v) { return kTop + plot_h - v / y_top * plot_h; };

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"" << kWidth / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">" << escape_xml(title) << "</text>\n";
  for (double t = 0; t <= y_top + y_step / 2; t += y_step) {
    svg << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + plot_w << "\" y1=\"" << py(t) << "\" y2=\"" << py(t) << "\" stroke=\"#ddd\"/>";
    svg << "<text x=\"" << kLeft - 6 << "\" y=\"" << py(t) + 4 << "\" text-anchor=\"end\">" << number(t) << "</text>\n";
  }
  for (double t = 0; t <= x_top + x_step / 2; t += x_step)
    svg << "<text x=\"" << px(t) << "\" y=\"" << kTop + plot_h + 18 << "\" text-anchor=\"middle\">" << number(t) << "</text>\n";
  svg << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft << "\" y1=\"" << kTop << "\" y2=\"" << kTop + plot_h << "\" stroke=\"black\"/>\n";
  svg << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + plot_w << "\" y1=\"" << kTop + plot_h << "\" y2=\"" << kTop + plot_h << "\" stroke=\"black\"/>\n";
  svg << "<text x=\"" << kLeft + plot_w / 2 << "\" y=\"" << kHeight - 18 << "\" text-anchor=\"middle\">" << escape_xml(x_label) << "</text>\n";
  svg << "<text transform=\"translate(20," << kTop + plot_h / 2 << ") rotate(-90)\" text-anchor=\"middle\">" << escape_xml(y_label) << "</text>\n";
  static const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
  for (std::size_t i = 0; i < series.size(); ++i) {
    const char* color = kColors[i % std::size(kColors)];
    svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
    for (std::size_t k = 0; k < x.size(); ++k)
      if (std::isfinite(x[k]) && std::isfinite(series[i].y[k])) svg << px(x[k]) << "," << py(series[i].y[k]) << " ";
    svg << "\"/>\n";
    for (std::size_t k = 0; k < x.size(); ++k)
      if (std::isfinite(x[k]) && std::isfinite(series[i].y[k]))
        svg << "<circle cx=\"" << px(x[k]) << "\" cy=\"" << py(series[i].y[k]) << "\" r=\"3\" fill=\"" << color << "\"/>\n";
    const double legend_y = kTop + 10 + 20 * static_cast<double>(i);
    svg << "<line x1=\"" << kWidth - kRight + 15 << "\" x2=\"" << kWidth - kRight + 40 << "\" y1=\"" << legend_y << "\" y2=\"" << legend_y
        << "\" stroke=\"" << color << "\" stroke-width=\"2\"/>";
    svg << "<text x=\"" << kWidth - kRight + 46 << "\" y=\"" << legend_y + 4 << "\">" << escape_xml(series[i].label) << "</text>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace promptly::loadgen
