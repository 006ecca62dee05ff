#pragma once
// Reference (scalar) conversions between F32 and every supported storage type. These are the
// ground truth that the fast kernels are tested against, and what `quantize` writes.
#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace promptly {

// Converts one row of `n` elements (n a multiple of the block size) to F32.
void dequantize_row(DType type, const void* src, float* dst, std::size_t n);

// Converts one row of `n` F32 elements to `type`; throws Error for types without a quantizer.
void quantize_row(DType type, const float* src, void* dst, std::size_t n);

bool can_quantize_to(DType type);

}  // namespace promptly
