#pragma once
// Facts about this process and machine read from /proc.
#include <cstddef>

namespace promptly {

// VmHWM: the process's peak resident set so far, in MB.
double peak_rss_mb();
// VmRSS: the process's resident set now, in MB.
double rss_mb();
// Starts VmHWM over from the current resident set (Linux's /proc/self/clear_refs); false where the
// kernel does not allow it.
bool reset_peak_rss();
// MemAvailable: memory the kernel could hand out now without swapping, in bytes.
std::size_t available_memory_bytes();

}  // namespace promptly
