#include "metrics/process.h"

#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <fstream>
#include <iterator>
#include <string>

namespace promptly::metrics {

double process_cpu_seconds() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

long long statm_resident_pages(std::string_view statm) {
  // "size resident shared text lib data dt": skip the first field.
  const std::size_t first_end = statm.find(' ');
  if (first_end == std::string_view::npos) return -1;
  std::string_view rest = statm.substr(first_end + 1);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  long long pages = -1;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), pages);
  if (ec != std::errc() || pages < 0 || (end != rest.data() + rest.size() && *end != ' ' && *end != '\n')) return -1;
  return pages;
}

std::size_t process_resident_bytes() {
  std::ifstream file("/proc/self/statm");
  const std::string line((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const long long pages = statm_resident_pages(line);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages < 0 || page_size <= 0) return 0;
  return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size);
}

}  // namespace promptly::metrics
