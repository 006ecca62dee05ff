#include "kv/block_pool.h"

#include <cstring>
#include <string>

#include "tensor/quant.h"
#include "util/error.h"

namespace promptly {

const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::F32: return "f32";
    case KvType::F16: return "f16";
    case KvType::Q8_0: return "q8_0";
  }
  return "?";
}

KvType parse_kv_type(const std::string& name) {
  if (name == "f32" || name == "F32") return KvType::F32;
  if (name == "f16" || name == "F16") return KvType::F16;
  if (name == "q8_0" || name == "Q8_0") return KvType::Q8_0;
  throw Error("unknown KV cache type '" + name + "'; supported: f16, q8_0, f32");
}

DType kv_type_dtype(KvType t) {
  switch (t) {
    case KvType::F32: return DType::F32;
    case KvType::F16: return DType::F16;
    case KvType::Q8_0: return DType::Q8_0;
  }
  return DType::F32;
}

std::size_t kv_row_bytes(std::size_t kv_dim, KvType t) {
  switch (t) {
    case KvType::F32: return 4 * kv_dim;
    case KvType::F16: return 2 * kv_dim;
    case KvType::Q8_0:
      if (kv_dim % kQK8_0 != 0) {
        throw Error("a Q8_0 KV cache needs rows that are a multiple of 32 values, but this model's are " + std::to_string(kv_dim) +
                    "; use --kv-type f16");
      }
      return kv_dim / kQK8_0 * sizeof(BlockQ8_0);
  }
  return 4 * kv_dim;
}

std::size_t BlockPool::block_bytes(std::size_t n_layers, std::size_t kv_dim, std::size_t block_tokens, KvType type) {
  return n_layers * 2 * block_tokens * kv_row_bytes(kv_dim, type);
}

namespace {

// Heads as segments where they divide the row and fit the type's blocks; else whole rows.
std::size_t pick_segment_dim(std::size_t kv_dim, std::size_t head_dim, KvType type) {
  if (head_dim == 0 || kv_dim % head_dim != 0) return kv_dim;
  if (type == KvType::Q8_0 && head_dim % kQK8_0 != 0) return kv_dim;
  return head_dim;
}

}  // namespace

BlockPool::BlockPool(std::size_t n_layers, std::size_t kv_dim, std::size_t block_tokens, std::size_t n_blocks, KvType type,
                     std::size_t head_dim)
    : n_layers_(n_layers),
      kv_dim_(kv_dim),
      block_tokens_(block_tokens),
      type_(type),
      row_bytes_(kv_row_bytes(kv_dim, type)),
      segment_dim_(pick_segment_dim(kv_dim, head_dim, type)),
      segment_bytes_(kv_row_bytes(segment_dim_, type)),
      refs_(n_blocks, 0) {
  if (block_tokens == 0 || n_blocks == 0) throw Error("KV pool needs at least one block of at least one token");
  storage_ = HugePageBuffer(n_blocks * block_bytes(n_layers, kv_dim, block_tokens, type));
  free_.reserve(n_blocks);
  for (std::size_t b = n_blocks; b-- > 0;) free_.push_back(static_cast<int>(b));
}

int BlockPool::allocate() {
  if (free_.empty()) return -1;
  const int b = free_.back();
  free_.pop_back();
  refs_[static_cast<std::size_t>(b)] = 1;
  return b;
}

void BlockPool::retain(int block) {
  if (refs_[static_cast<std::size_t>(block)] <= 0) throw Error("internal: retaining free KV block " + std::to_string(block));
  ++refs_[static_cast<std::size_t>(block)];
}

void BlockPool::release(int block) {
  int& r = refs_[static_cast<std::size_t>(block)];
  if (r <= 0) throw Error("internal: releasing free KV block " + std::to_string(block));
  if (--r == 0) free_.push_back(block);
}

void BlockPool::copy_rows(int from, int to, std::size_t n_rows) {
  if (n_rows > block_tokens_) throw Error("internal: copying more rows than a KV block holds");
  for (std::size_t layer = 0; layer < n_layers_; ++layer) {
    for (std::size_t e = 0; e < kv_dim_; e += segment_dim_) {
      const std::size_t at = offset_of(0, e);
      std::memcpy(keys(to, layer) + at, keys(from, layer) + at, n_rows * segment_bytes_);
      std::memcpy(values(to, layer) + at, values(from, layer) + at, n_rows * segment_bytes_);
    }
  }
}

void BlockPool::copy_row(int from, std::size_t from_slot, int to, std::size_t to_slot) {
  for (std::size_t layer = 0; layer < n_layers_; ++layer) {
    for (std::size_t e = 0; e < kv_dim_; e += segment_dim_) {
      std::memcpy(keys(to, layer) + offset_of(to_slot, e), keys(from, layer) + offset_of(from_slot, e), segment_bytes_);
      std::memcpy(values(to, layer) + offset_of(to_slot, e), values(from, layer) + offset_of(from_slot, e), segment_bytes_);
    }
  }
}

void BlockPool::store(const float* row, std::uint8_t* dst, std::size_t slot) const {
  const DType t = kv_type_dtype(type_);
  for (std::size_t e = 0; e < kv_dim_; e += segment_dim_) quantize_row(t, row + e, dst + offset_of(slot, e), segment_dim_);
}

void BlockPool::load(const std::uint8_t* src, std::size_t slot, float* row) const {
  const DType t = kv_type_dtype(type_);
  for (std::size_t e = 0; e < kv_dim_; e += segment_dim_) dequantize_row(t, src + offset_of(slot, e), row + e, segment_dim_);
}

}  // namespace promptly
