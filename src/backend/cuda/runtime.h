#pragma once
// What the CUDA runtime says about this machine's devices. Plain C++ (no CUDA headers), so the
// rest of the program includes it without nvcc.
#include <cstddef>
#include <string>
#include <vector>

namespace promptly::backend::cuda {

// Devices the runtime sees; 0 with `error` set when there is no driver or no device.
int device_count(std::string& error);
std::vector<std::string> describe_devices();

}  // namespace promptly::backend::cuda
