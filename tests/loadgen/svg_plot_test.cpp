#include "loadgen/svg_plot.h"

#include <gtest/gtest.h>

#include "util/error.h"

namespace promptly::loadgen {
namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(SvgPlot, OneLineAndOneMarkerPerPointForEachSeries) {
  const std::string svg = line_chart_svg("TTFT <sweep> & more", "rate", "ms", {0.5, 1, 2, 4},
                                         {{"TTFT p50", {10, 12, 20, 80}}, {"TTFT p99", {15, 30, 60, 400}}, {"ITL p99", {5, 5, 6, 9}}});
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(count(svg, "<polyline"), 3u);
  EXPECT_EQ(count(svg, "<circle"), 12u);
  for (const char* label : {"TTFT p50", "TTFT p99", "ITL p99"}) EXPECT_NE(svg.find(label), std::string::npos);
  EXPECT_NE(svg.find("TTFT &lt;sweep&gt; &amp; more"), std::string::npos);
  EXPECT_EQ(svg.find("<sweep>"), std::string::npos);
  // The y axis reaches past the largest value: 400 gets a tick at 400.
  EXPECT_NE(svg.find(">400<"), std::string::npos);
}

TEST(SvgPlot, HandlesOnePointAndAllZeros) {
  const std::string svg = line_chart_svg("t", "x", "y", {3}, {{"zero", {0}}});
  EXPECT_EQ(count(svg, "<circle"), 1u);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(SvgPlot, RejectsSeriesOfTheWrongLength) {
  EXPECT_THROW(line_chart_svg("t", "x", "y", {1, 2}, {{"short", {1}}}), Error);
  EXPECT_THROW(line_chart_svg("t", "x", "y", {}, {}), Error);
}

}  // namespace
}  // namespace promptly::loadgen
