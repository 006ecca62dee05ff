#pragma once
// The paged KV store: one pool of fixed-size token blocks, each holding K and V for every layer.
// Sequences own lists of blocks (block tables), blocks are reference-counted so that sequences can
// share a prefix, and the memory is one allocation sized by a budget up front (pages are touched,
// and so become resident, only as blocks fill).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace promptly {

// Element type of cached keys and values. F16 halves the memory (and the bandwidth attention reads)
// at a precision loss far below the model's own; F32 is kept for tests and exact comparisons.
enum class KvType { F32, F16 };
const char* kv_type_name(KvType t);
KvType parse_kv_type(const std::string& name);  // "f32" | "f16"; throws Error otherwise
std::size_t kv_type_bytes(KvType t);

class BlockPool {
 public:
  BlockPool(std::size_t n_layers, std::size_t kv_dim, std::size_t block_tokens, std::size_t n_blocks, KvType type = KvType::F16);

  // Bytes one block takes (K and V, all layers).
  static std::size_t block_bytes(std::size_t n_layers, std::size_t kv_dim, std::size_t block_tokens, KvType type);

  // A free block with one reference, or -1 when every block is in use.
  int allocate();
  void retain(int block);
  // Drops one reference; the block is free again at zero.
  void release(int block);
  int refs(int block) const { return refs_[static_cast<std::size_t>(block)]; }

  std::size_t n_blocks() const { return refs_.size(); }
  std::size_t n_free() const { return free_.size(); }
  std::size_t block_tokens() const { return block_tokens_; }
  std::size_t kv_dim() const { return kv_dim_; }
  KvType type() const { return type_; }

  // block_tokens rows of kv_dim elements of type(): the keys (values) of `layer` in `block`.
  std::uint8_t* keys(int block, std::size_t layer) { return base(block, layer); }
  std::uint8_t* values(int block, std::size_t layer) { return base(block, layer) + block_tokens_ * kv_dim_ * elem_; }

 private:
  std::uint8_t* base(int block, std::size_t layer) {
    return storage_.get() + (static_cast<std::size_t>(block) * n_layers_ + layer) * 2 * block_tokens_ * kv_dim_ * elem_;
  }

  std::size_t n_layers_, kv_dim_, block_tokens_;
  KvType type_;
  std::size_t elem_;
  std::unique_ptr<std::uint8_t[]> storage_;
  std::vector<int> refs_;
  std::vector<int> free_;  // a stack: the most recently freed block (warm in cache) is reused first
};

}  // namespace promptly
