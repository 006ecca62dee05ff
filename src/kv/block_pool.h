#pragma once
// The paged KV store: one pool of fixed-size token blocks, each holding K and V for every layer.
// Sequences own lists of blocks (block tables), blocks are reference-counted so that sequences can
// share a prefix, and the memory is one allocation sized by a budget up front (pages are touched,
// and so become resident, only as blocks fill), backed by huge pages (see util/huge_pages.h).
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tensor/dtype.h"
#include "util/huge_pages.h"

namespace promptly {

// Element type of cached keys and values. F16 halves the memory (and the bandwidth attention reads)
// at a precision loss far below the model's own; Q8_0 (ggml's 32-element blocks, 8.5 bits per
// value) nearly halves it again, so the same budget holds 1.9x the tokens; F32 is kept for tests
// and exact comparisons.
enum class KvType { F32, F16, Q8_0 };
const char* kv_type_name(KvType t);
KvType parse_kv_type(const std::string& name);  // "f32" | "f16" | "q8_0"; throws Error otherwise
DType kv_type_dtype(KvType t);
// Bytes of one cached row (one position's keys or values for one layer); throws Error when the
// type cannot hold rows of kv_dim elements (Q8_0 needs a multiple of 32).
std::size_t kv_row_bytes(std::size_t kv_dim, KvType t);

// Inside a block, each layer's keys (then values) are stored head by head: all of the block's
// positions for KV head 0, then for head 1, and so on. Attention reads one head at a time, and this
// way that head's rows are one contiguous run (2 KiB for 16 F16 rows of 64) that the hardware
// prefetchers stream, rather than 128 bytes out of every 512 (BM_AttentionTilePaged: 25-40% less
// time for a decoding token's GQA group). The unit is a "segment" of segment_dim() elements: the
// head dimension, or the whole row where the head dimension does not fit the element type's blocks
// (Q8_0 needs multiples of 32) or was not given.
//
// Sliding-window layers ("local", flagged in local_layers) can keep their keys and values apart: in
// a segment of their own that each block takes when allocated, from a store that may hold fewer
// segments than there are blocks (what sequences' windows need at once, not every cached block). A block's holders say how they use
// it (Hold): a sequence whose queries' windows may still reach the block reads it whole; the prefix
// tree's own reference, or a sequence whose window has left the block (unpin_local), needs only the
// other layers. Once no holder reads it whole, its local segment is given up: it stays with the
// block (a prefix match can still use it, and takes it back) until another block needs a segment.
// Which one that block takes, in order: one given up behind some sequence's window (its KV matters
// only to a request that branches off there: a shared system prompt, a follow-up whose history
// tokenizes differently near its end), so that the segments resident stay few; else an unused one;
// else one of a block no sequence ever left behind (the last window of a finished conversation:
// what its follow-up needs). Within a tier, the one given up longest ago (a system prompt that new
// conversations keep passing is given up again each time, so it stays).
// The spool reads and writes a block in the layout of a pool that keeps every layer together
// (block_parts), so its files are the same either way.
class BlockPool {
 public:
  // n_local_segments: how many blocks at once may have their local layers' KV (0: all of them).
  BlockPool(std::size_t n_layers, std::size_t kv_dim, std::size_t block_tokens, std::size_t n_blocks, KvType type = KvType::F16,
            std::size_t head_dim = 0, const std::vector<bool>& local_layers = {}, std::size_t n_local_segments = 0);

  // Bytes one block takes (K and V, all layers; with local layers apart, the part in the block and
  // the part in its segment).
  static std::size_t block_bytes(std::size_t n_layers, std::size_t kv_dim, std::size_t block_tokens, KvType type);

  // How a holder uses a block (see above). Without local layers apart the two are the same.
  enum class Hold { Whole, Cached };
  // A free block with one reference (Whole), or -1 when every block is in use or every local
  // segment is read whole (out_of_segments).
  int allocate();
  // A block without a local segment (its local layers' KV is never needed: behind every window of
  // whoever will read it), or -1 when none is free.
  int allocate_without_local();
  bool out_of_segments() const { return n_local_ > 0 && held_segments_ >= n_segments_; }
  std::size_t n_local_segments() const { return n_segments_; }
  // Takes one more reference; a Whole one takes back the block's local segment if it is still there.
  void retain(int block, Hold hold = Hold::Whole);
  // Drops one reference of the given kind; the block is free again at zero.
  void release(int block, Hold hold = Hold::Whole);
  // One Whole holder turns into a Cached one: its queries no longer reach the block's local layers.
  // True when that made the local segment reusable.
  bool unpin_local(int block);
  int refs(int block) const { return refs_[static_cast<std::size_t>(block)]; }
  // Copies the first n_rows positions (K and V, every layer, every head) of block `from` into block `to`.
  void copy_rows(int from, int to, std::size_t n_rows);
  // Copies one position (K and V, every layer, every head) from slot `from_slot` of block `from` to
  // slot `to_slot` of block `to`, bytes as stored.
  void copy_row(int from, std::size_t from_slot, int to, std::size_t to_slot);

  // Tensor parallelism: the other ranks hold their own slices of the same blocks and must repeat
  // every copy before the next forward pass, so rank 0's pool keeps a log of them (off by default):
  // n_rows positions from slot from_slot of block `from` on to slot to_slot of block `to` on
  // (copy_rows: slots 0 and 0; copy_row: one row).
  struct RowCopy {
    int from;
    std::size_t from_slot;
    int to;
    std::size_t to_slot, n_rows;
  };
  // Repeats one logged copy exactly as it was made.
  void replay(const RowCopy& copy);
  void log_copies(bool on) { log_copies_ = on; }
  std::vector<RowCopy> take_copies() { return std::exchange(copies_, {}); }
  const std::vector<RowCopy>& copies() const { return copies_; }

  std::size_t n_blocks() const { return refs_.size(); }
  std::size_t n_free() const { return free_.size(); }
  std::size_t block_tokens() const { return block_tokens_; }
  std::size_t kv_dim() const { return kv_dim_; }
  KvType type() const { return type_; }
  std::size_t segment_dim() const { return segment_dim_; }

  // The whole block (every layer's keys and values, layer by layer) as the runs of memory it lies in,
  // in order: block_bytes() bytes in all, one run unless local layers live apart. What the KV spool
  // writes and reads back. Where the local segment is gone (has_local), throws Error, or with
  // `skip_missing` gives runs with a null data pointer for the bytes that have nowhere to go.
  std::vector<std::span<std::uint8_t>> block_parts(int block, bool skip_missing = false);
  std::vector<std::span<const std::uint8_t>> block_parts(int block) const;
  std::size_t n_layers() const { return n_layers_; }

  // Whether local layers live apart (see above), and whether `block` still has their segment (held,
  // or reusable but not yet reused); without one its local layers' keys() are null.
  bool has_separate_local_layers() const { return n_local_ > 0; }
  bool has_local(int block) const { return local_of_.empty() || local_of_[static_cast<std::size_t>(block)] >= 0; }
  // Bytes of K/V the blocks in use and the local segments held Whole hold.
  std::size_t bytes_in_use() const;
  // Bytes of K/V the pool can hold: every block, and its local segments.
  std::size_t capacity_bytes() const { return (n_blocks() * (n_layers_ - n_local_) + n_segments_ * n_local_) * layer_bytes(); }

  // The keys (values) of `layer` in `block`: kv_dim / segment_dim() segments, each block_tokens rows
  // of segment_dim() elements of type(). Null for a local layer whose segment was released.
  std::uint8_t* keys(int block, std::size_t layer) { return base(block, layer); }
  std::uint8_t* values(int block, std::size_t layer) {
    std::uint8_t* k = base(block, layer);
    return k ? k + block_tokens_ * row_bytes_ : nullptr;
  }
  // Bytes of one position's keys (values) of one layer, all segments together.
  std::size_t row_bytes() const { return row_bytes_; }
  // Byte offset, from keys() or values(), of row `slot`'s elements starting at `element` (a multiple
  // of segment_dim(); to the end of that segment).
  std::size_t offset_of(std::size_t slot, std::size_t element) const {
    return (element / segment_dim_ * block_tokens_ + slot) * segment_bytes_;
  }

  // Where the rows of a run of elements that does not cross a segment (a KV head: first element
  // head * head_dim) lie, in elements of type() from keys() or values(): row `slot` starts at
  // offset + slot * stride.
  struct Rows {
    std::size_t offset, stride;
  };
  Rows rows_of(std::size_t first_element) const {
    return {first_element / segment_dim_ * block_tokens_ * segment_dim_ + first_element % segment_dim_, segment_dim_};
  }

  // Stores one position's row (kv_dim floats) into slot `slot` of `dst` (keys() or values()),
  // converted to type(); load reads it back.
  void store(const float* row, std::uint8_t* dst, std::size_t slot) const;
  void load(const std::uint8_t* src, std::size_t slot, float* row) const;

 private:
  std::size_t layer_bytes() const { return 2 * block_tokens_ * row_bytes_; }
  std::uint8_t* base(int block, std::size_t layer) {
    const std::size_t b = static_cast<std::size_t>(block);
    if (n_local_ == 0) return storage_.data() + (b * n_layers_ + layer) * layer_bytes();
    if (!is_local_[layer]) return storage_.data() + (b * (n_layers_ - n_local_) + group_index_[layer]) * layer_bytes();
    const int segment = local_of_[b];
    if (segment < 0) return nullptr;
    return local_storage_.data() + (static_cast<std::size_t>(segment) * n_local_ + group_index_[layer]) * layer_bytes();
  }

  std::size_t n_layers_, kv_dim_, block_tokens_;
  KvType type_;
  std::size_t row_bytes_, segment_dim_, segment_bytes_;
  HugePageBuffer storage_;  // every layer of each block, or only the non-local ones when they live apart
  std::vector<int> refs_;
  bool log_copies_ = false;
  std::vector<RowCopy> copies_;
  std::vector<int> free_;  // a stack: the most recently freed block (warm in cache) is reused first
  // Local layers apart: which layers, each layer's index within its group, the local segments
  // (as many as blocks, so a block always gets one), which one each block has (-1: none) and which
  // block each segment is with (-1: none), each block's Whole holders.
  std::size_t n_local_ = 0;
  std::vector<bool> is_local_;
  std::vector<std::size_t> group_index_;
  HugePageBuffer local_storage_;
  std::vector<int> local_of_, owner_of_, whole_;
  std::size_t n_segments_ = 0;
  std::size_t held_segments_ = 0;  // with a block that has Whole holders
  // The segments another block may take, in three tiers (see above): queues, oldest first. A
  // segment's one valid entry is the one with its tier_ and stamp_ (an older entry, of a segment
  // taken back or queued again since, is skipped when reached).
  enum Tier : std::uint8_t { kBehind, kUnused, kFrontier, kNone };
  struct SpareEntry {
    int segment;
    std::uint32_t stamp;
  };
  std::deque<SpareEntry> spare_[3];
  std::vector<std::uint8_t> tier_;
  std::vector<std::uint32_t> stamp_;
  bool is_valid(const SpareEntry& e, Tier tier) const {
    return tier_[static_cast<std::size_t>(e.segment)] == tier && stamp_[static_cast<std::size_t>(e.segment)] == e.stamp;
  }
  std::vector<bool> left_behind_;  // per block: some sequence's window has left it
  void add_whole(int block);
  void drop_whole(int block, Tier tier);
  void offer_segment(int segment, Tier tier);
  int take_segment();
};

}  // namespace promptly
