#pragma once
// This process's resource use, for the standard Prometheus process_* metrics.
#include <cstddef>
#include <string_view>

namespace promptly::metrics {

// User plus system CPU time of every thread of this process so far, in seconds.
double process_cpu_seconds();
// Resident set size now, in bytes (/proc/self/statm); 0 where it cannot be read.
std::size_t process_resident_bytes();
// The resident pages in a /proc/<pid>/statm line (its second field), or -1 for a malformed line.
long long statm_resident_pages(std::string_view statm);

}  // namespace promptly::metrics
