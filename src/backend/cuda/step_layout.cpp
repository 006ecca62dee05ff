#include "backend/cuda/step_layout.h"

#include <algorithm>
#include <bit>
#include <unordered_map>

#include "kv/kv_cache.h"
#include "model/batch.h"

namespace promptly::backend::cuda {

int attention_span(const Batch& batch) {
  int longest = 0;
  for (std::size_t t = 0; t < batch.size(); ++t) {
    const std::int32_t tree = batch.tree_context[t];
    longest = std::max(longest, tree < 0 ? batch.positions[t] + 1 : tree + static_cast<int>(std::bit_width(batch.tree_ancestors[t])));
  }
  return longest;
}

StepLayout pack_step(const Batch& batch, const KvCache& cache, std::vector<std::int32_t>& packed, int tile_tokens) {
  StepLayout layout;
  layout.T = static_cast<int>(batch.size());
  const int T = layout.T;
  packed.assign(static_cast<std::size_t>(layout.tables()), 0);
  std::unordered_map<int, std::int32_t> table_start;  // by sequence
  for (int t = 0; t < T; ++t) {
    packed[layout.tokens() + t] = batch.tokens[t];
    packed[layout.positions() + t] = batch.positions[t];
    packed[layout.slots() + t] = batch.kv_slots[t];
    const std::int32_t tree = batch.tree_context[t];
    const std::uint64_t ancestors = tree < 0 ? 0 : batch.tree_ancestors[t];
    packed[layout.tree_contexts() + t] = tree;
    packed[layout.tree_ancestors() + 2 * t] = static_cast<std::int32_t>(static_cast<std::uint32_t>(ancestors));
    packed[layout.tree_ancestors() + 2 * t + 1] = static_cast<std::int32_t>(static_cast<std::uint32_t>(ancestors >> 32));
    auto [it, fresh] = table_start.try_emplace(batch.seq_ids[t], static_cast<std::int32_t>(packed.size()) - layout.tables());
    if (fresh) {
      const std::vector<int>& blocks = cache.blocks(batch.seq_ids[t]);
      packed.insert(packed.end(), blocks.begin(), blocks.end());
    }
    packed[layout.table_starts() + t] = it->second;
    if (batch.want_logits[t]) packed[layout.out_rows() + layout.n_out++] = t;
  }
  for (int t = 0; t < T;) {  // runs of one sequence and one tree context
    int end = t + 1;
    while (end < T && batch.seq_ids[end] == batch.seq_ids[t] && batch.tree_context[end] == batch.tree_context[t]) ++end;
    const int run = end - t;
    if (tile_tokens <= 0 || run < kAttentionTileMinTokens) {
      for (; t < end; ++t) packed[layout.lone() + layout.n_lone++] = t;
      continue;
    }
    const int n = (run + tile_tokens - 1) / tile_tokens;
    for (int i = 0; i < n; ++i) {
      const int count = run / n + (i < run % n ? 1 : 0);
      packed[layout.tiles() + 2 * layout.n_tiles] = t;
      packed[layout.tiles() + 2 * layout.n_tiles + 1] = count;
      ++layout.n_tiles;
      t += count;
    }
  }
  return layout;
}

AttentionShape attention_shape(int T, int n_head, int longest, int multiprocessors, int max_splits) {
  const int blocks_per_split = std::max(T * n_head, 1);
  const int n_splits = std::clamp(4 * multiprocessors / blocks_per_split, 1, std::max(max_splits, 1));
  const int chunk = std::max(64, (std::max(longest, 1) + n_splits - 1) / n_splits);
  return {static_cast<int>(std::bit_ceil(static_cast<unsigned>(chunk))), n_splits};
}

}  // namespace promptly::backend::cuda
