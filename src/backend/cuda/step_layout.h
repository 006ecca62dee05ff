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

// Attention tiles (kernels.cuh's attention_tiles): prefill's queries that share each key and value
// they load, at most attention_tile_tokens of them. Runs shorter than kAttentionTileMinTokens (a
// decoding sequence's token in a step with another's prompt, short token trees) go to the per-token
// kernel instead, whose four warps share one query's keys: a tile of one or two queries would
// leave three of its warps idle while the first scores their keys alone.
constexpr int kAttentionTileMinTokens = 8;
// The most queries a tile holds for heads of head_dim elements: the tile's queries (floats) and 32
// keys and values (halves) fit a block's 48 KB of static shared memory, 16 queries of heads up to
// 128 (27 KB), 8 of heads up to 256 (Gemma 2's: 42 KB). 0: no tiles for such heads (larger ones,
// or not of whole 8-byte pieces).
constexpr int attention_tile_tokens(int head_dim) {
  return head_dim <= 0 || head_dim % 4 ? 0 : head_dim <= 128 ? 16 : head_dim <= 256 ? 8 : 0;
}

// Offsets (in int32s) of StepMeta's arrays in the packed step: tokens, positions, slots, table
// starts, the rows that want logits and the tree contexts (T each), the tree ancestors (2T: each
// token's 64-bit mask, low half first), the attention tiles (n_tiles pairs of first token and
// count, room for T pairs), the tokens in no tile (n_lone, room for T), then the block tables of
// the batch's sequences, each sequence's once, in order of first appearance. Every offset depends
// on T alone, as the graphs of decode steps need.
struct StepLayout {
  int T = 0;
  int n_out = 0;    // rows that want logits
  int n_tiles = 0;  // runs of kAttentionTileMinTokens or more consecutive tokens of one sequence
                    // and one tree context (or none), cut into as few tiles as pack_step's
                    // tile_tokens allows, of sizes within one of each other
  int n_lone = 0;   // the tokens of shorter runs
  int tokens() const { return 0; }
  int positions() const { return T; }
  int slots() const { return 2 * T; }
  int table_starts() const { return 3 * T; }
  int out_rows() const { return 4 * T; }
  int tree_contexts() const { return 5 * T; }
  int tree_ancestors() const { return 6 * T; }
  int tiles() const { return 8 * T; }
  int lone() const { return 10 * T; }
  int tables() const { return 11 * T; }
};

// The most positions a token of `batch` scans in attention: its position + 1, or for a tree node its
// tree's context and the tree's slots up to its last ancestor.
int attention_span(const Batch& batch);

// Packs `batch` (whose sequences the cache holds, reserved up to each token's slot) into `packed`,
// its runs in tiles of at most tile_tokens (attention_tile_tokens of the model's heads; 0: no
// tiles, every token on its own).
StepLayout pack_step(const Batch& batch, const KvCache& cache, std::vector<std::int32_t>& packed, int tile_tokens);

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
