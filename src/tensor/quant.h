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

// Q5_0 blocks as Q8_0 ones, exactly: the same scale, the levels -16..15 as bytes (n elements, a
// multiple of 32). What the kernels read instead of Q5_0 (model.cpp).
void q5_0_to_q8_0(const void* src, void* dst, std::size_t n);

// Q3_K blocks as Q6_K ones, exactly: the same d, each sub-block's scale as its int8 scale, the levels
// -4..3 as Q6_K's (n elements, a multiple of 256). What the kernels read instead of Q3_K (model.cpp).
void q3_k_to_q6_k(const void* src, void* dst, std::size_t n);

// IQ4_NL blocks as Q8_0 ones, exactly: the same scale, each index's level as the byte (n elements,
// a multiple of 32). What the kernels read instead of IQ4_NL (model.cpp).
void iq4_nl_to_q8_0(const void* src, void* dst, std::size_t n);

}  // namespace promptly
