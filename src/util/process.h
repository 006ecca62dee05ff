#pragma once
// Facts about this process and machine read from /proc.
#include <cstddef>

namespace promptly {

// VmHWM: the process's peak resident set so far, in MB.
double peak_rss_mb();
// MemAvailable: memory the kernel could hand out now without swapping, in bytes.
std::size_t available_memory_bytes();

}  // namespace promptly
