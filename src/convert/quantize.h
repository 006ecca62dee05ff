#pragma once
// `promptly quantize`: rewrites a GGUF with its matrices in another type. Metadata is copied as is
// (file_type updated); 1-D tensors (norms, biases) stay as they are.
#include <string>

#include "util/thread_pool.h"

namespace promptly {

// target: F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q3_K, Q3_K_M, Q4_K, Q4_K_M, Q5_K, Q5_K_M, Q6_K, IQ4_NL, IQ4_XS. Returns a one-line summary.
std::string quantize_model(const std::string& in_path, const std::string& out_path, const std::string& target,
                           ThreadPool& pool);

}  // namespace promptly
