#pragma once
// What the host sends the GPU before each step, as one int32 array (one copy from a pinned
// buffer), and how attention splits each query's context. Plain C++: the host tests check both on
// machines without a GPU.
#include <cstdint>
#include <vector>

namespace promptly {
class KvCache;
struct Batch;
}  // namespace promptly

namespace promptly::backend::cuda {

// Offsets (in int32s) of StepMeta's arrays in the packed step: tokens, positions, slots, table
// starts, the rows that want logits and the tree contexts (T each), the tree ancestors (2T: each
// token's 64-bit mask, low half first), then the block tables of the batch's sequences, each
// sequence's once, in order of first appearance.
struct StepLayout {
  int T = 0;
  int n_out = 0;  // rows that want logits
  int tokens() const { return 0; }
  int positions() const { return T; }
  int slots() const { return 2 * T; }
  int table_starts() const { return 3 * T; }
  int out_rows() const { return 4 * T; }
  int tree_contexts() const { return 5 * T; }
  int tree_ancestors() const { return 6 * T; }
  int tables() const { return 8 * T; }
};

// The most positions a token of `batch` scans in attention: its position + 1, or for a tree node its
// tree's context and the tree's slots up to its last ancestor.
int attention_span(const Batch& batch);

// Packs `batch` (whose sequences the cache holds, reserved up to each token's slot) into `packed`.
StepLayout pack_step(const Batch& batch, const KvCache& cache, std::vector<std::int32_t>& packed);

// FlashDecoding's split of each query's context: enough splits for `T` tokens of `n_head` heads to
// give the GPU's `multiprocessors` about four blocks each (a count that depends on the batch's size
// alone, at most max_splits), and chunks of a power of two positions (at least 64) that together
// cover `longest` positions, so that few CUDA graphs serve every context length.
struct AttentionShape {
  int chunk = 64;
  int n_splits = 1;
};
AttentionShape attention_shape(int T, int n_head, int longest, int multiprocessors, int max_splits);

}  // namespace promptly::backend::cuda
