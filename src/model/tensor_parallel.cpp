#include "model/tensor_parallel.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "model/model.h"
#include "tensor/dtype.h"
#include "util/error.h"

namespace promptly::tensor_parallel {
namespace {

kernels::WeightMatrix rows_of(const kernels::WeightMatrix& m, Part p) {
  return {m.type, m.row(p.first), p.size(), m.cols, m.layout};
}

kernels::WeightMatrix columns_of(const kernels::WeightMatrix& m, Part p, OwnedSlices& owned, const gguf::File& file) {
  const DTypeInfo& info = dtype_info(m.type);
  const std::size_t skip = p.first / info.block_size * info.block_bytes;
  kernels::WeightMatrix slice{m.type, nullptr, m.rows, p.size(), m.layout};
  const std::size_t stride = slice.row_stride();
  owned.emplace_back(m.rows * stride);
  std::uint8_t* dst = owned.back().data();
  for (std::size_t r = 0; r < m.rows; ++r) std::memcpy(dst + r * stride, m.row(r) + skip, stride);
  file.release_pages(m.data, m.rows * m.row_stride());
  slice.data = dst;
  return slice;
}

void check_divides(std::size_t n, int ranks, const char* what) {
  if (n % static_cast<std::size_t>(ranks) != 0) {
    throw Error("--tp " + std::to_string(ranks) + ": the model's " + std::to_string(n) + " " + what + " do not split into " +
                std::to_string(ranks) + " equal parts");
  }
}

void check_columns(const kernels::WeightMatrix& m, std::size_t width, int ranks, const char* what) {
  const std::uint32_t block = dtype_info(m.type).block_size;
  if (width % block != 0) {
    throw Error("--tp " + std::to_string(ranks) + ": each rank's " + std::to_string(width) + " columns of " + what + " (" +
                std::string(dtype_name(m.type)) + ") do not fall on its " + std::to_string(block) + "-element blocks; try fewer ranks");
  }
}

}  // namespace

Part kv_part_of(const ModelConfig& c, int rank, int ranks) {
  // A rank's query heads use one contiguous run of KV heads; with fewer KV heads than ranks the one
  // they share is held (and its cache kept) by each of the ranks whose queries use it.
  const std::size_t group = c.n_head / c.n_head_kv;
  const std::size_t first_head = c.n_head * static_cast<std::size_t>(rank) / static_cast<std::size_t>(ranks);
  const std::size_t first = first_head / group, n = std::max<std::size_t>(1, c.n_head_kv / static_cast<std::size_t>(ranks));
  return {first * c.head_dim, (first + n) * c.head_dim};
}

void check_splittable(const ModelConfig& c, const LayerWeights& l, int ranks) {
  check_divides(c.n_head, ranks, "attention heads");
  const auto r = static_cast<std::size_t>(ranks);
  if (c.n_head_kv % r != 0 && r % c.n_head_kv != 0) {
    throw Error("--tp " + std::to_string(ranks) + ": the model's " + std::to_string(c.n_head_kv) +
                " KV heads can be neither split into nor shared by " + std::to_string(ranks) + " ranks");
  }
  check_columns(l.wo, c.q_dim() / static_cast<std::size_t>(ranks), ranks, "attn_output");
  if (c.is_moe()) {
    check_divides(c.n_ff_expert, ranks, "expert FFN columns");
    check_columns(l.exp_down.front(), c.n_ff_expert / static_cast<std::size_t>(ranks), ranks, "ffn_down_exps");
  } else {
    check_divides(c.n_ff, ranks, "FFN columns");
    check_columns(l.w_down, c.n_ff / static_cast<std::size_t>(ranks), ranks, "ffn_down");
  }
}

void shard_layer(LayerWeights& l, const ModelConfig& c, int rank, int ranks, OwnedSlices& owned, const gguf::File& file) {
  const Part q = part_of(c.q_dim(), rank, ranks), kv = kv_part_of(c, rank, ranks);
  l.wq = rows_of(l.wq, q);
  l.wk = rows_of(l.wk, kv);
  l.wv = rows_of(l.wv, kv);
  l.wo = columns_of(l.wo, q, owned, file);
  if (l.bq) l.bq += q.first;
  if (l.bk) l.bk += kv.first;
  if (l.bv) l.bv += kv.first;
  if (c.is_moe()) {
    const Part f = part_of(c.n_ff_expert, rank, ranks);
    for (std::size_t e = 0; e < l.exp_gate.size(); ++e) {
      l.exp_gate[e] = rows_of(l.exp_gate[e], f);
      l.exp_up[e] = rows_of(l.exp_up[e], f);
      l.exp_down[e] = columns_of(l.exp_down[e], f, owned, file);
    }
  } else {
    const Part f = part_of(c.n_ff, rank, ranks);
    l.w_gate = rows_of(l.w_gate, f);
    l.w_up = rows_of(l.w_up, f);
    l.w_down = columns_of(l.w_down, f, owned, file);
  }
}

ModelConfig local_config(const ModelConfig& c, int ranks) {
  ModelConfig local = c;
  const auto r = static_cast<std::uint32_t>(ranks);
  local.n_head /= r;
  local.n_head_kv = std::max<std::uint32_t>(1, local.n_head_kv / r);
  local.n_ff /= r;
  local.n_ff_expert /= r;
  return local;
}

std::vector<std::int64_t> Step::encode() const {
  std::vector<std::int64_t> w = {static_cast<std::int64_t>(command), static_cast<std::int64_t>(cache_id), cache.n_blocks, cache.max_positions,
                                 cache.kv_type, cache.block_tokens, cache.segment_dim, static_cast<std::int64_t>(batch.size()),
                                 static_cast<std::int64_t>(sequences.size()), static_cast<std::int64_t>(copies.size())};
  for (std::size_t t = 0; t < batch.size(); ++t) {
    w.insert(w.end(), {batch.tokens[t], batch.positions[t], batch.seq_ids[t], batch.want_logits[t], batch.kv_slots[t], batch.tree_context[t],
                       std::bit_cast<std::int64_t>(batch.tree_ancestors[t])});
  }
  for (const Sequence& s : sequences) {
    w.insert(w.end(), {s.seq, static_cast<std::int64_t>(s.length), static_cast<std::int64_t>(s.blocks.size())});
    w.insert(w.end(), s.blocks.begin(), s.blocks.end());
  }
  for (const BlockPool::RowCopy& c : copies) {
    w.insert(w.end(), {c.from, static_cast<std::int64_t>(c.from_slot), c.to, static_cast<std::int64_t>(c.to_slot), static_cast<std::int64_t>(c.n_rows)});
  }
  return w;
}

Step Step::decode(const std::vector<std::int64_t>& w) {
  std::size_t at = 0;
  const auto next = [&]() -> std::int64_t {
    if (at >= w.size()) throw Error("tensor parallelism: a truncated step message from rank 0");
    return w[at++];
  };
  Step s;
  s.command = static_cast<Command>(next());
  if (s.command == Command::Stop) return s;
  if (s.command != Command::Forward) throw Error("tensor parallelism: an unknown command from rank 0");
  s.cache_id = static_cast<std::uint64_t>(next());
  s.cache.n_blocks = next(), s.cache.max_positions = next(), s.cache.kv_type = next(), s.cache.block_tokens = next(), s.cache.segment_dim = next();
  const std::int64_t n_tokens = next(), n_sequences = next(), n_copies = next();
  for (std::int64_t t = 0; t < n_tokens; ++t) {
    const auto token = static_cast<std::int32_t>(next()), position = static_cast<std::int32_t>(next()), seq = static_cast<std::int32_t>(next());
    const bool logits = next() != 0;
    const auto slot = static_cast<std::int32_t>(next()), context = static_cast<std::int32_t>(next());
    const auto ancestors = std::bit_cast<std::uint64_t>(next());
    if (context < 0) {
      if (slot != position || ancestors != 0) throw Error("tensor parallelism: a malformed batch token from rank 0");
      s.batch.add(token, position, seq, logits);
    } else {  // a tree node, as Batch::add_tree_node made it (Model::forward checks the rest)
      s.batch.tokens.push_back(token);
      s.batch.positions.push_back(position);
      s.batch.seq_ids.push_back(seq);
      s.batch.want_logits.push_back(logits ? 1 : 0);
      s.batch.kv_slots.push_back(slot);
      s.batch.tree_context.push_back(context);
      s.batch.tree_ancestors.push_back(ancestors);
    }
  }
  for (std::int64_t i = 0; i < n_sequences; ++i) {
    Sequence q{static_cast<int>(next()), static_cast<std::size_t>(next()), {}};
    const std::int64_t n = next();
    if (n < 0 || static_cast<std::size_t>(n) > w.size()) throw Error("tensor parallelism: a malformed step message from rank 0");
    for (std::int64_t b = 0; b < n; ++b) q.blocks.push_back(static_cast<int>(next()));
    s.sequences.push_back(std::move(q));
  }
  for (std::int64_t i = 0; i < n_copies; ++i) {
    const int from = static_cast<int>(next());
    const auto from_slot = static_cast<std::size_t>(next());
    const int to = static_cast<int>(next());
    const auto to_slot = static_cast<std::size_t>(next()), n_rows = static_cast<std::size_t>(next());
    s.copies.push_back({from, from_slot, to, to_slot, n_rows});
  }
  return s;
}

}  // namespace promptly::tensor_parallel
