#include "util/process.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>

namespace promptly {

bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool written = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && written;
}

namespace {

// A "Name: N kB" field of /proc/self/status in MB, or -1 where there is none.
double status_mb(const char* format) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  double kb = -1;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, format, &kb) == 1) break;
  }
  std::fclose(f);
  return kb < 0 ? -1 : kb / 1024.0;
}

}  // namespace

double peak_rss_mb() {
  const double mb = status_mb("VmHWM: %lf kB");
  if (mb >= 0) return mb;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

double rss_mb() { return std::max(0.0, status_mb("VmRSS: %lf kB")); }

std::size_t available_memory_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return std::size_t{4} << 30;  // unknown: assume a modest machine
  char line[256];
  unsigned long long kb = 0;
  bool found = false;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
      found = true;
      break;
    }
  }
  std::fclose(f);
  return found ? static_cast<std::size_t>(kb) * 1024 : std::size_t{4} << 30;
}

}  // namespace promptly
