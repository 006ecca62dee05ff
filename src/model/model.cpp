#include "model/model.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <iterator>
#include <unordered_map>
#include <string>
#include <utility>

#include "backend/device.h"
#include "kernels/cpu.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"
#include "model/moe.h"
#include "tensor/quant.h"
#include "util/error.h"

namespace promptly {
namespace {

std::string shape_str(const std::vector<std::uint64_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

class TensorLoader {
 public:
  explicit TensorLoader(const gguf::File& f) : f_(f) {}

  const gguf::TensorInfo* find(const std::string& name, const std::vector<std::uint64_t>& shape, bool required) {
    const gguf::TensorInfo* t = f_.find_tensor(name);
    if (!t) {
      if (required) throw Error("model '" + f_.path() + "' lacks tensor '" + name + "'");
      return nullptr;
    }
    if (t->dims != shape) {
      throw Error("model '" + f_.path() + "': tensor '" + name + "' has shape " + t->shape_string() + ", expected " +
                  shape_str(shape));
    }
    if (!dtype_info(t->type).supported) {
      throw Error("unsupported tensor type " + std::string(dtype_name(t->type)) + " in tensor '" + name +
                  "'; supported: " + supported_dtype_list());
    }
    return t;
  }

  kernels::WeightMatrix matrix(const std::string& name, std::uint64_t cols, std::uint64_t rows) {
    const gguf::TensorInfo* t = find(name, {cols, rows}, true);
    return {t->type, t->data, rows, cols};
  }

  std::optional<kernels::WeightMatrix> optional_matrix(const std::string& name, std::uint64_t cols, std::uint64_t rows) {
    const gguf::TensorInfo* t = find(name, {cols, rows}, false);
    if (!t) return std::nullopt;
    return kernels::WeightMatrix{t->type, t->data, rows, cols};
  }

  bool has(const std::string& name) const { return f_.find_tensor(name) != nullptr; }

  // Row ranges of one stored matrix (fused q/k/v, gate/up): views in the order given, which must
  // add up to its rows.
  std::vector<kernels::WeightMatrix> split(const std::string& name, std::uint64_t cols, const std::vector<std::uint64_t>& parts) {
    std::uint64_t rows = 0;
    for (std::uint64_t r : parts) rows += r;
    const kernels::WeightMatrix whole = matrix(name, cols, rows);
    std::vector<kernels::WeightMatrix> views;
    std::uint64_t first = 0;
    for (std::uint64_t r : parts) {
      views.push_back({whole.type, whole.row(first), r, cols});
      first += r;
    }
    return views;
  }

  // A stack of n matrices of rows x cols (the experts of an MoE layer): one view per matrix.
  std::vector<kernels::WeightMatrix> stack(const std::string& name, std::uint64_t cols, std::uint64_t rows, std::uint64_t n) {
    const gguf::TensorInfo* t = find(name, {cols, rows, n}, true);
    std::vector<kernels::WeightMatrix> views;
    for (std::uint64_t e = 0; e < n; ++e) {
      kernels::WeightMatrix m{t->type, t->data, rows, cols};
      m.data += e * rows * m.row_stride();
      views.push_back(m);
    }
    return views;
  }

  // 1-D tensors (norms, biases) are used directly as floats, so they must be F32.
  const float* vector(const std::string& name, std::uint64_t n, bool required = true) {
    const gguf::TensorInfo* t = find(name, {n}, required);
    if (!t) return nullptr;
    if (t->type != DType::F32) {
      throw Error("model '" + f_.path() + "': tensor '" + name + "' is " + std::string(dtype_name(t->type)) +
                  "; 1-D tensors must be F32");
    }
    if (reinterpret_cast<std::uintptr_t>(t->data) % alignof(float) != 0) {
      throw Error("model '" + f_.path() + "': tensor '" + name + "' is misaligned");
    }
    return reinterpret_cast<const float*>(t->data);
  }

 private:
  const gguf::File& f_;
};

LayerWeights load_layer(const ModelConfig& c, TensorLoader& load, std::uint32_t il) {
  const arch::Arch& a = *c.desc;
  const std::string p = "blk." + std::to_string(il) + ".";
  LayerWeights l;
  l.local = c.layer_is_local(il);
  l.attn_norm = load.vector(p + "attn_norm.weight", c.n_embd);
  l.ffn_norm = load.vector(p + "ffn_norm.weight", c.n_embd);
  if (a.fused_qkv) {
    const auto qkv = load.split(p + "attn_qkv.weight", c.n_embd, {c.q_dim(), c.kv_dim(), c.kv_dim()});
    l.wq = qkv[0], l.wk = qkv[1], l.wv = qkv[2];
  } else {
    l.wq = load.matrix(p + "attn_q.weight", c.n_embd, c.q_dim());
    l.wk = load.matrix(p + "attn_k.weight", c.n_embd, c.kv_dim());
    l.wv = load.matrix(p + "attn_v.weight", c.n_embd, c.kv_dim());
  }
  l.wo = load.matrix(p + "attn_output.weight", c.q_dim(), c.n_embd);
  if (a.qkv_bias) {
    l.bq = load.vector(p + "attn_q.bias", c.q_dim(), false);
    l.bk = load.vector(p + "attn_k.bias", c.kv_dim(), false);
    l.bv = load.vector(p + "attn_v.bias", c.kv_dim(), false);
  }
  if (a.qk_norm) {
    l.q_norm = load.vector(p + "attn_q_norm.weight", c.head_dim);
    l.k_norm = load.vector(p + "attn_k_norm.weight", c.head_dim);
  }
  if (a.post_norms) {
    l.post_attn_norm = load.vector(p + "post_attention_norm.weight", c.n_embd);
    l.post_ffn_norm = load.vector(p + "post_ffw_norm.weight", c.n_embd);
  }
  if (c.is_moe()) {
    l.router = load.matrix(p + "ffn_gate_inp.weight", c.n_embd, c.n_expert);
    if (!load.has(p + "ffn_gate_exps.weight") && load.has(p + "ffn_gate.0.weight")) {
      // Early Mixtral files (before llama.cpp merged the experts): one 2-D tensor per expert.
      for (std::uint32_t e = 0; e < c.n_expert; ++e) {
        const std::string n = std::to_string(e);
        l.exp_gate.push_back(load.matrix(p + "ffn_gate." + n + ".weight", c.n_embd, c.n_ff_expert));
        l.exp_up.push_back(load.matrix(p + "ffn_up." + n + ".weight", c.n_embd, c.n_ff_expert));
        l.exp_down.push_back(load.matrix(p + "ffn_down." + n + ".weight", c.n_ff_expert, c.n_embd));
      }
    } else {
      l.exp_gate = load.stack(p + "ffn_gate_exps.weight", c.n_embd, c.n_ff_expert, c.n_expert);
      l.exp_up = load.stack(p + "ffn_up_exps.weight", c.n_embd, c.n_ff_expert, c.n_expert);
      l.exp_down = load.stack(p + "ffn_down_exps.weight", c.n_ff_expert, c.n_embd, c.n_expert);
    }
  } else if (a.fused_gate_up) {
    const auto gate_up = load.split(p + "ffn_up.weight", c.n_embd, {c.n_ff, c.n_ff});
    l.w_gate = gate_up[0], l.w_up = gate_up[1];
    l.w_down = load.matrix(p + "ffn_down.weight", c.n_ff, c.n_embd);
  } else {
    l.w_gate = load.matrix(p + "ffn_gate.weight", c.n_embd, c.n_ff);
    l.w_up = load.matrix(p + "ffn_up.weight", c.n_embd, c.n_ff);
    l.w_down = load.matrix(p + "ffn_down.weight", c.n_ff, c.n_embd);
  }
  return l;
}

std::vector<float> rope_speeds(std::uint32_t n_rot, double base, double scale, const float* factors) {
  std::vector<float> inv_freq(n_rot / 2);
  for (std::uint32_t i = 0; i < n_rot / 2; ++i) {
    double f = scale * std::pow(base, -2.0 * i / n_rot);
    if (factors) f /= factors[i];
    inv_freq[i] = static_cast<float>(f);
  }
  return inv_freq;
}

}  // namespace

Model::Model(std::shared_ptr<const gguf::File> file, std::shared_ptr<parallel::Communicator> tp, const ModelLoadOptions& options)
    : file_(std::move(file)), full_config_(ModelConfig::from_gguf(*file_)), tp_(std::move(tp)) {
  if (tp_ && tp_->size() == 1) tp_.reset();
  ModelConfig& c = full_config_;
  const gguf::TensorInfo* embd = file_->find_tensor("token_embd.weight");
  if (!embd) throw Error("model '" + file_->path() + "' lacks tensor 'token_embd.weight'");
  if (embd->dims.size() != 2) throw Error("model '" + file_->path() + "': token_embd.weight must be 2-D");
  c.n_vocab = static_cast<std::uint32_t>(embd->dims[1]);

  TensorLoader load(*file_);
  token_embd_ = load.matrix("token_embd.weight", c.n_embd, c.n_vocab);
  output_norm_ = load.vector("output_norm.weight", c.n_embd);
  // Tied embeddings: models without output.weight reuse the token embedding matrix.
  output_ = load.optional_matrix("output.weight", c.n_embd, c.n_vocab).value_or(token_embd_);

  // block_count is read from metadata; a corrupt value must not size an allocation before the tensors
  // vouch for it. Every block has at least six required tensors (phi3's fused layout).
  constexpr std::size_t kRequiredTensorsPerBlock = 6;
  if (c.n_layer > file_->tensors().size() / kRequiredTensorsPerBlock) {
    throw Error("model '" + file_->path() + "': block_count is " + std::to_string(c.n_layer) + " but the file holds only " +
                std::to_string(file_->tensors().size()) + " tensors, too few for that many blocks");
  }
  layers_.reserve(c.n_layer);
  for (std::uint32_t i = 0; i < c.n_layer; ++i) layers_.push_back(load_layer(c, load, i));

  config_ = c;
  vocab_part_ = {0, c.n_vocab};
  if (tp_ && !layers_.empty()) {
    const int rank = tp_->rank(), ranks = tp_->size();
    tensor_parallel::check_splittable(c, layers_.front(), ranks);
    for (LayerWeights& l : layers_) tensor_parallel::shard_layer(l, c, rank, ranks, owned_slices_, *file_);
    vocab_part_ = tensor_parallel::part_of(c.n_vocab, rank, ranks);
    output_ = {output_.type, output_.row(vocab_part_.first), vocab_part_.size(), output_.cols, output_.layout};
    config_ = tensor_parallel::local_config(c, ranks);
  }

  convert_matrices(options.float_matrices_as, options.keep_file_layout);
  if (!options.keep_file_layout) repack_for_kernels();
  if (converted_.data()) {  // the repacking may have copied every converted matrix away
    const std::uint8_t *lo = converted_.data(), *hi = lo + converted_.size();
    const auto matrices = layer_and_output_matrices();
    if (std::none_of(matrices.begin(), matrices.end(), [&](const kernels::WeightMatrix* m) { return m->data >= lo && m->data < hi; })) {
      converted_ = HugePageBuffer();
    }
  }
  if (!owned_slices_.empty()) {  // the column slices that moved into the repacked buffer are copies no longer read
    std::vector<const std::uint8_t*> in_use;
    for (const LayerWeights& l : layers_) {
      in_use.push_back(l.wo.data), in_use.push_back(l.w_down.data);
      for (const kernels::WeightMatrix& m : l.exp_down) in_use.push_back(m.data);
    }
    std::erase_if(owned_slices_, [&](const auto& slice) { return std::find(in_use.begin(), in_use.end(), slice.data()) == in_use.end(); });
  }
  if (tp_) {
    // Reading this rank's rows mapped the other ranks' rows beside them too (the kernel maps whole
    // page-cache folios, megabytes on recent kernels): give every tensor's pages back once; what
    // this rank reads in place (norms, embedding rows, unrepacked slices) faults back as it is used.
    for (const gguf::TensorInfo& t : file_->tensors()) file_->release_pages(t.data, t.n_bytes);
  }

  // Per-pair frequency divisors: Llama 3's rope_freqs, or LongRoPE's (Phi-3 128k, Phi-3.5): the
  // short factors for contexts up to rope.scaling.original_context_length, the long ones past it.
  // As llama.cpp decides, by the context the cache is sized for (a sequence's whole context is
  // rotated one way), not by a token's position: see forward.
  const float* freq_factors = load.vector("rope_freqs.weight", c.n_rot / 2, false);
  if (!freq_factors) {
    freq_factors = load.vector("rope_factors_short.weight", c.n_rot / 2, false);
    const float* long_factors = load.vector("rope_factors_long.weight", c.n_rot / 2, false);
    if (long_factors && c.rope_orig_ctx > 0) inv_freq_long_ = rope_speeds(c.n_rot, c.rope_freq_base, c.rope_freq_scale, long_factors);
  }
  inv_freq_ = rope_speeds(c.n_rot, c.rope_freq_base, c.rope_freq_scale, freq_factors);
  if (c.swa_rope_base > 0) inv_freq_local_ = rope_speeds(c.n_rot, c.swa_rope_base, 1.0, nullptr);
}

std::vector<kernels::WeightMatrix*> Model::layer_and_output_matrices() {
  std::vector<kernels::WeightMatrix*> matrices;
  for (LayerWeights& l : layers_) {
    for (kernels::WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      if (m->data) matrices.push_back(m);
    }
    for (auto* experts : {&l.exp_gate, &l.exp_up, &l.exp_down}) {
      for (kernels::WeightMatrix& m : *experts) matrices.push_back(&m);
    }
  }
  // A tied output is the embedding table: the embedding goes on reading its rows where they are
  // stored, and the output gets a (repacked or converted) copy of its own. Without one a Q6_K table
  // (what every quantized mix but Q8_0 gives a tied embedding) runs through the generic
  // dequantizing path, which at 8192 x 512 made the code model's whole Q4_0 decode 4x slower than
  // its Q8_0.
  matrices.push_back(&output_);
  return matrices;
}

namespace {

// The types no kernel reads as stored, and the type each becomes at load, exactly: Q5_0 as Q8_0 (the
// same scales, each level a byte), Q3_K as Q6_K (the same d, each sub-block scale an int8 one, levels
// -4..3 among Q6_K's -32..31), IQ4_NL as Q8_0 (the same scale, each index's level a byte). The int8
// kernels, repacked or on the GPU, read those. A token streams more bytes (Q5_0: 34 against 22 a
// block; Q3_K: 210 against 110; IQ4_NL: 34 against 18), and still decodes several times faster than
// through the dequantizing path (docs/performance.md, 2026-12-07). cpu_plain_only: the AVX-512
// kernels (repacked, Q3_Kx16) and the GPU read the type as it is, so only a matrix the CPU reads in
// the file's layout (no AVX-512, or rows not a multiple of 16) converts. IQ4_XS has kernels of its
// own everywhere.
struct LoadConversion {
  DType from, to;
  void (*convert)(const void* src, void* dst, std::size_t n);
  bool cpu_plain_only;
};
constexpr LoadConversion kLoadConversions[] = {{DType::Q5_0, DType::Q8_0, q5_0_to_q8_0, false},
                                               {DType::Q3_K, DType::Q6_K, q3_k_to_q6_k, true},
                                               {DType::IQ4_NL, DType::Q8_0, iq4_nl_to_q8_0, false}};

const LoadConversion* load_conversion_of(DType stored, bool cpu_plain) {
  for (const LoadConversion& c : kLoadConversions) {
    if (c.from == stored && (cpu_plain || !c.cpu_plain_only)) return &c;
  }
  return nullptr;
}

// Whether the CPU will read this matrix in the file's layout: it stays on the host (no device
// uploads it) and Model::repack_for_kernels will not repack it.
bool read_plain_on_cpu(const kernels::WeightMatrix& m, bool keep_file_layout) {
  return !keep_file_layout && !(kernels::active_isa() >= kernels::Isa::Avx512 && kernels::can_repack_x16(m));
}

}  // namespace

DType kernel_type_of(DType stored, bool cpu_plain) {
  const LoadConversion* c = load_conversion_of(stored, cpu_plain);
  return c ? c->to : stored;
}

// The matrices of the types kLoadConversions lists become their kernel types. With floats_to (one
// of the types the int8 kernels read as stored: what a draft's F16 matrices may become), the float
// matrices (F32, F16, BF16) are quantized to it.
void Model::convert_matrices(std::optional<DType> floats_to, bool keep_file_layout) {
  constexpr DType kFloatsTo[] = {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K};
  if (floats_to && std::find(std::begin(kFloatsTo), std::end(kFloatsTo), *floats_to) == std::end(kFloatsTo)) {
    throw Error("model '" + file_->path() + "': float matrices convert at load to Q8_0, Q4_0, Q4_K or Q6_K, not " +
                std::string(dtype_name(*floats_to)));
  }
  const auto target = [&](const kernels::WeightMatrix& m) -> std::optional<DType> {
    if (m.layout != kernels::Layout::Plain) return std::nullopt;
    if (const LoadConversion* exact = load_conversion_of(m.type, read_plain_on_cpu(m, keep_file_layout))) return exact->to;
    const bool is_float = m.type == DType::F32 || m.type == DType::F16 || m.type == DType::BF16;
    if (is_float && floats_to && m.cols % dtype_info(*floats_to).block_size == 0) return floats_to;
    return std::nullopt;
  };
  std::vector<std::pair<kernels::WeightMatrix*, DType>> conversions;
  std::size_t total = 0;
  for (kernels::WeightMatrix* m : layer_and_output_matrices()) {
    if (const std::optional<DType> to = target(*m)) {
      conversions.emplace_back(m, *to);
      total += m->rows * row_bytes(*to, m->cols);
    }
  }
  if (total == 0) return;
  converted_ = HugePageBuffer(total);
  std::uint8_t* next = converted_.data();
  std::vector<float> row;
  for (const auto& [m, to] : conversions) {
    row.resize(m->cols);
    const std::size_t stride = row_bytes(to, m->cols);
    const LoadConversion* exact = load_conversion_of(m->type, true);  // m is converting: its conversion, whatever its condition
    for (std::size_t r = 0; r < m->rows; ++r) {
      if (exact) {
        exact->convert(m->row(r), next + r * stride, m->cols);
      } else {
        dequantize_row(m->type, m->row(r), row.data(), m->cols);
        quantize_row(to, row.data(), next + r * stride, m->cols);
      }
    }
    file_->release_pages(m->data, m->rows * m->row_stride());  // a tied embedding faults back the rows it reads
    m->data = next;
    m->type = to;
    next += m->rows * stride;
  }
}

void Model::repack_for_kernels() {
  // Only the AVX-512 paths (and AMX, built on them) have kernels for the interleaved layout; others
  // read ggml's as stored.
  if (kernels::active_isa() < kernels::Isa::Avx512) return;
  std::vector<kernels::WeightMatrix*> matrices = layer_and_output_matrices();
  std::erase_if(matrices, [](const kernels::WeightMatrix* m) { return !kernels::can_repack_x16(*m); });
  // One buffer on huge pages for all of them. Decode streams every weight once per token: on 4 KiB
  // pages that is a TLB miss every 4 KiB and a hardware prefetcher that stops at each page boundary.
  // (The file's own pages are released as each matrix moves, so the peak stays near one copy.)
  const auto slot_bytes = [](const kernels::WeightMatrix& m) {  // each matrix starts on a 4 KiB boundary
    constexpr std::size_t kAlign = 4096;
    return (kernels::repacked_bytes(m) + kAlign - 1) / kAlign * kAlign;
  };
  std::size_t total = 0;
  for (const kernels::WeightMatrix* m : matrices) total += slot_bytes(*m);
  repacked_ = HugePageBuffer(total);
  std::uint8_t* next = repacked_.data();
  for (kernels::WeightMatrix* m : matrices) {
    const std::size_t slot = slot_bytes(*m);
    const kernels::Layout layout = kernels::repack_x16(*m, next);
    file_->release_pages(m->data, m->rows * m->row_stride());  // a tied embedding faults back the rows it reads
    m->data = next;
    m->layout = layout;
    next += slot;
  }
}

LocalLayers Model::local_layers() const {
  LocalLayers local;
  if (config_.sliding_window == 0 || tp_) return local;
  for (std::size_t il = 0; il < config_.n_layer; ++il) local.is_local.push_back(config_.layer_is_local(il));
  local.window = config_.sliding_window;
  return local;
}

KvCache Model::make_cache(std::size_t max_positions, KvType type, std::size_t max_sequences, bool release_local) const {
  // A device keeps every layer of a block together, as F16 (backend/device.h): the host pool says
  // the same, so that what the KV spool writes of it is a host pool's block, files the same either way.
  const LocalLayers local = release_local && !device_ ? local_layers() : LocalLayers{};
  KvCache cache(config_.n_layer, config_.kv_dim(), max_positions, max_sequences, device_ ? backend::kDeviceKvType : type,
                KvCache::kDefaultBlockTokens, config_.head_dim, local);
  if (device_) device_->attach_kv(cache);
  // The other ranks repeat rank 0's row copies (a prefix's copy-on-read, a token tree's accepted path
  // moving into place) before the next pass: send_step.
  if (tp_ && tp_->rank() == 0) cache.pool().log_copies(true);
  return cache;
}

namespace {

// Attention work for one layer: for each sequence and KV head, its tokens' query heads of that KV
// head's group (token-major, so a tile's queries see nearly the same positions), cut into tiles of
// at most kAttentionTile. The same for every layer of a pass.
struct AttentionTile {
  int seq;
  std::size_t kv_head, first, n;
  std::size_t cost = 0;     // keys read: the sum of its queries' context lengths
  std::size_t cached = 0;   // positions before its latest query's: what the cache held before this batch
};

// context[t]: how many of its sequence's first positions token t attends to in the tiles.
void plan_attention_tiles(const Batch& batch, const std::vector<std::size_t>& context, std::size_t n_head_kv, std::size_t group,
                          std::vector<AttentionTile>& tiles, std::vector<std::pair<std::size_t, std::size_t>>& tile_queries) {
  const std::size_t T = batch.size();
  tiles.clear();
  tile_queries.clear();
  std::vector<int> seqs;
  for (std::size_t t = 0; t < T; ++t) {
    if (std::find(seqs.begin(), seqs.end(), batch.seq_ids[t]) == seqs.end()) seqs.push_back(batch.seq_ids[t]);
  }
  for (int seq : seqs) {
    for (std::size_t kvh = 0; kvh < n_head_kv; ++kvh) {
      std::size_t first = tile_queries.size();
      for (std::size_t t = 0; t < T; ++t) {
        if (batch.seq_ids[t] != seq) continue;
        for (std::size_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          tile_queries.emplace_back(t, h);
          if (tile_queries.size() - first == kernels::kAttentionTile) {
            tiles.push_back({seq, kvh, first, kernels::kAttentionTile});
            first = tile_queries.size();
          }
        }
      }
      if (tile_queries.size() > first) tiles.push_back({seq, kvh, first, tile_queries.size() - first});
    }
  }
  // Tiles cost in proportion to the keys their queries read, and those differ by orders of magnitude
  // when a long prompt's chunk shares a step with short decode streams. Fixed equal counts of tiles
  // per thread would leave one core with all of the long prompt's tiles; instead they are sorted
  // most expensive first (longest-processing-time order) and go out in the pool's shrinking claims,
  // a thread that runs out stealing the cheaper end of another's part, so they finish together.
  for (AttentionTile& tile : tiles) {
    for (std::size_t k = 0; k < tile.n; ++k) {
      const std::size_t n_ctx = context[tile_queries[tile.first + k].first];
      tile.cost += n_ctx;
      tile.cached = std::max(tile.cached, n_ctx - 1);
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(), [](const AttentionTile& a, const AttentionTile& b) { return a.cost > b.cost; });
}

// Scratch kept per thread across calls: a fresh multi-megabyte allocation per prefill chunk would be
// page-faulted and zeroed by the kernel every time. (ForwardPass holds a reference: a thread_local
// named inside a worker lambda would be the running thread's own instance.)
struct Scratch {
  std::vector<float> x, xn, q, k, v, attn, tmp, gate, up, rope_cos, rope_sin, rope_cos_local, rope_sin_local;
  kernels::ActivationBuffers attn_act, ffn_act, down_act;  // the quantized inputs of q/k/v, gate/up and down
  std::vector<float> rank_logits;  // tensor-parallel: this rank's vocabulary rows
  std::vector<AttentionTile> tiles;
  std::vector<std::pair<std::size_t, std::size_t>> tile_queries;  // (token, head)
  // Per token: the positions of its sequence the tiles attend over (a tree node: those before its
  // tree, see Batch). With a tree in the batch, per (token, head) the log-sum-exp of those scores,
  // with which the tree's nodes add their ancestors afterwards.
  std::vector<std::size_t> context;
  std::vector<float> lse;
  std::unordered_map<int, std::pair<std::vector<const void*>, std::vector<const void*>>> tables;  // block tables per sequence
};

}  // namespace

// One forward pass over a batch: the residual stream x and every buffer between the layer's steps.
// Model::forward is the loop over layers; each step here is one piece of a layer as its
// architecture describes it.
struct Model::ForwardPass {
  const Model& m;
  const ModelConfig& c;
  const Batch& batch;
  KvCache& cache;
  ThreadPool& pool;
  Scratch& s;
  const std::size_t T, D, QD, KVD, HD, F, R;
  const bool tree;  // some token of the batch is a tree node

  ForwardPass(const Model& model, const Batch& b, KvCache& kv, ThreadPool& p, Scratch& scratch)
      : m(model), c(model.config_), batch(b), cache(kv), pool(p), s(scratch), T(b.size()), D(c.n_embd), QD(c.q_dim()),
        KVD(c.kv_dim()), HD(c.head_dim), F(c.n_ff), R(c.n_rot / 2), tree(b.has_tree()) {}

  std::size_t slot(std::size_t t) const { return static_cast<std::size_t>(batch.kv_slots[t]); }

  // The per-token work between matmuls (norms, RoPE, cache writes, activations) is split across the
  // pool for prompt-sized batches; one token's worth stays on this thread, where waking a worker
  // would cost more than it saves. Each token's arithmetic is the same either way.
  template <typename Fn>
  void per_token(Fn&& fn) {
    pool.parallel_for(T, 4, [&](std::size_t begin, std::size_t end, int) {
      for (std::size_t t = begin; t < end; ++t) fn(t);
    });
  }

  // x += tmp for one token: a sublayer's output joins the residual stream, through its own norm
  // when the architecture has one there (Gemma's post-attention and post-FFN norms).
  void add_residual(std::size_t t, const float* post_norm) {
    if (post_norm) kernels::rmsnorm(&s.tmp[t * D], post_norm, D, c.rms_eps, &s.tmp[t * D]);
    for (std::size_t i = t * D; i < (t + 1) * D; ++i) s.x[i] += s.tmp[i];
  }

  // Checks the batch, sizes the buffers, computes each token's rotations, embeds the tokens and
  // plans the attention tiles.
  void begin() {
    m.check_batch(batch);
    reserve_slots(batch, cache);
    if (m.tp_ && m.tp_->rank() == 0) m.send_step(batch, cache);
    s.context.resize(T);
    for (std::size_t t = 0; t < T; ++t) {
      const std::int32_t context = batch.tree_context[t];
      s.context[t] = context < 0 ? static_cast<std::size_t>(batch.positions[t]) + 1 : static_cast<std::size_t>(context);
    }
    if (tree) s.lse.resize(T * c.n_head);
    const std::size_t local_rope = m.inv_freq_local_.empty() ? 0 : T * R;
    const float* inv_freq = m.rope_speeds_for(cache.max_positions()).data();
    for (auto [buf, n] : {std::pair{&s.x, T * D}, {&s.xn, T * D}, {&s.q, T * QD}, {&s.k, T * KVD}, {&s.v, T * KVD},
                          {&s.attn, T * QD}, {&s.tmp, T * D}, {&s.gate, c.is_moe() ? 0 : T * F}, {&s.up, c.is_moe() ? 0 : T * F},
                          {&s.rope_cos, T * R}, {&s.rope_sin, T * R}, {&s.rope_cos_local, local_rope}, {&s.rope_sin_local, local_rope}}) {
      buf->resize(n);
    }
    per_token([&](std::size_t t) {  // each token's rotation, the same for every head and layer (of a kind)
      const auto position = static_cast<float>(batch.positions[t]);
      kernels::rope_angles(c.n_rot, inv_freq, position, &s.rope_cos[t * R], &s.rope_sin[t * R]);
      if (c.rope_attn_factor != 1.0f) {
        for (std::size_t i = t * R; i < (t + 1) * R; ++i) s.rope_cos[i] *= c.rope_attn_factor, s.rope_sin[i] *= c.rope_attn_factor;
      }
      if (local_rope) kernels::rope_angles(c.n_rot, m.inv_freq_local_.data(), position, &s.rope_cos_local[t * R], &s.rope_sin_local[t * R]);
    });
    const float embed_scale = c.desc->embed_scale ? std::sqrt(static_cast<float>(D)) : 1.0f;
    for (std::size_t t = 0; t < T; ++t) {
      dequantize_row(m.token_embd_.type, m.token_embd_.row(static_cast<std::size_t>(batch.tokens[t])), &s.x[t * D], D);
      if (embed_scale != 1.0f) for (std::size_t i = t * D; i < (t + 1) * D; ++i) s.x[i] *= embed_scale;
    }
    plan_attention_tiles(batch, s.context, c.n_head_kv, c.n_head / c.n_head_kv, s.tiles, s.tile_queries);
  }

  // The attention sublayer of layer il: (the previous layer's FFN output joins the residual stream)
  // norm, q/k/v, biases, per-head norms, RoPE, cache writes, attention, output projection -> tmp.
  void attention(std::size_t il) {
    const LayerWeights& L = m.layers_[il];
    // The residual add, the norm and the quantization of each token's normalized input happen in one
    // job, while the token is in cache: one wake-up and barrier instead of three (for a batch of
    // decode tokens, where these jobs are microseconds each, the barriers were several percent).
    const kernels::WeightMatrix* qkv[] = {&L.wq, &L.wk, &L.wv};
    kernels::Activations attn_in(s.xn.data(), T, D, s.attn_act);  // quantized once for q, k and v
    const bool quantize_attn_in = attn_in.begin_quantize_for(qkv);
    const float* prev_post_norm = il > 0 ? m.layers_[il - 1].post_ffn_norm : nullptr;
    per_token([&](std::size_t t) {
      if (il > 0) add_residual(t, prev_post_norm);
      kernels::rmsnorm(&s.x[t * D], L.attn_norm, D, c.rms_eps, &s.xn[t * D]);
      if (quantize_attn_in) attn_in.quantize_token(t);
    });
    if (quantize_attn_in) attn_in.end_quantize(pool);
    float* const qkv_out[] = {s.q.data(), s.k.data(), s.v.data()};
    kernels::matmul_fused(qkv, attn_in, qkv_out, pool);

    const bool own_rope = L.local && !m.inv_freq_local_.empty();
    per_token([&](std::size_t t) {
      float* q = &s.q[t * QD];
      float* k = &s.k[t * KVD];
      float* v = &s.v[t * KVD];
      if (L.bq) for (std::size_t i = 0; i < QD; ++i) q[i] += L.bq[i];
      if (L.bk) for (std::size_t i = 0; i < KVD; ++i) k[i] += L.bk[i];
      if (L.bv) for (std::size_t i = 0; i < KVD; ++i) v[i] += L.bv[i];
      if (L.q_norm) for (std::size_t h = 0; h < c.n_head; ++h) kernels::rmsnorm(q + h * HD, L.q_norm, HD, c.rms_eps, q + h * HD);
      if (L.k_norm) for (std::size_t h = 0; h < c.n_head_kv; ++h) kernels::rmsnorm(k + h * HD, L.k_norm, HD, c.rms_eps, k + h * HD);
      const float* cos = own_rope ? &s.rope_cos_local[t * R] : &s.rope_cos[t * R];
      const float* sin = own_rope ? &s.rope_sin_local[t * R] : &s.rope_sin[t * R];
      for (std::size_t h = 0; h < c.n_head; ++h) kernels::rope(q + h * HD, c.n_rot, cos, sin, c.rope_neox);
      for (std::size_t h = 0; h < c.n_head_kv; ++h) kernels::rope(k + h * HD, c.n_rot, cos, sin, c.rope_neox);
      cache.write(il, batch.seq_ids[t], slot(t), k, v);
    });
    attend(il, L.local ? c.sliding_window : 0);
    if (tree) attend_ancestors(il);
    kernels::matmul(L.wo, s.attn.data(), T, s.tmp.data(), pool);
    if (m.tp_) m.tp_->all_reduce_sum(s.tmp.data(), T * D);  // each rank's heads' share of the output
  }

  // Causal attention: token t sees positions [0, pos_t] of its own sequence (on a local layer the
  // last `window` of them), which the cache now holds whether they came from earlier calls or from
  // this batch. Work goes in the planned tiles, each one pass over its KV head's keys; windows and
  // the soft cap are applied inside the tiled kernels, so local layers and Gemma 2 run as fast as the rest.
  void attend(std::size_t il, std::size_t window) {
    const kernels::KernelTable& kt = kernels::kernel_table(kernels::active_isa());
    s.tables.clear();  // block tables of the batch's sequences for this layer, looked up once
    for (std::size_t t = 0; t < T; ++t) {
      auto [it, fresh] = s.tables.try_emplace(batch.seq_ids[t]);
      if (fresh) cache.block_pointers(il, batch.seq_ids[t], it->second.first, it->second.second);
    }
    const std::size_t block_tokens = cache.block_tokens();
    const DType kv_dtype = kv_type_dtype(cache.type());
    const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
    // A tile's keys and values were last read a step ago, with every weight streamed through the
    // caches since: cold. The kernel reaches them chunk by chunk, keys then values, each load after
    // the previous chunk's arithmetic, so a cold tile paid several DRAM latencies one after another.
    // Asking for all of a short tile's rows at once (and for the next tile of the same claim before
    // computing this one) overlaps them: 125m Q4_0 decode (12 one-query tiles a layer, ~1 us each)
    // +5-10%. Tiles go in the pool's claims rather than through a shared counter so that a thread
    // knows which tile comes next.
    const auto prefetch_tile = [&](const AttentionTile& tile) {
      const auto& [keys, values] = s.tables.at(tile.seq);
      if (keys.empty() || !keys.front()) return;  // the first rows were released behind the window: not what the tile reads
      const BlockPool::Rows at = cache.pool().rows_of(tile.kv_head * HD);
      kernels::prefetch_kv(keys.data(), values.data(), tile.cached, block_tokens, at.stride, at.offset, HD, kv_dtype);
    };
    pool.parallel_for(s.tiles.size(), 1, [&](std::size_t b, std::size_t e, int) {
      const float* qp[kernels::kAttentionTile];
      float* op[kernels::kAttentionTile];
      float lse[kernels::kAttentionTile];
      std::size_t n_ctx[kernels::kAttentionTile], first[kernels::kAttentionTile];
      if (b < e) prefetch_tile(s.tiles[b]);
      for (std::size_t i = b; i < e; ++i) {
        const AttentionTile& tile = s.tiles[i];
        if (i + 1 < e) prefetch_tile(s.tiles[i + 1]);
        for (std::size_t k = 0; k < tile.n; ++k) {
          const auto [t, h] = s.tile_queries[tile.first + k];
          qp[k] = &s.q[t * QD + h * HD];
          op[k] = &s.attn[t * QD + h * HD];
          n_ctx[k] = s.context[t];
          // The window ends at the query's own position (a tree node's is its depth past its context).
          const std::size_t end = static_cast<std::size_t>(batch.positions[t]) + 1;
          first[k] = window && end > window ? std::min(end - window, n_ctx[k]) : 0;
        }
        const auto& [keys, values] = s.tables.at(tile.seq);
        const BlockPool::Rows rows = cache.pool().rows_of(tile.kv_head * HD);
        kt.attention_tile(qp, window ? first : nullptr, n_ctx, tile.n, keys.data(), values.data(), kv_dtype, block_tokens, rows.stride,
                          rows.offset, HD, scale, c.attn_softcap, op, tree ? lse : nullptr);
        if (tree) {
          for (std::size_t k = 0; k < tile.n; ++k) {
            const auto [t, h] = s.tile_queries[tile.first + k];
            s.lse[t * c.n_head + h] = lse[k];
          }
        }
      }
    });
  }

  std::size_t tile_query_token(const AttentionTile& tile, std::size_t k) const { return s.tile_queries[tile.first + k].first; }

  // A tree node's attention so far covers its tree's context (attend); here each of its ancestors in
  // the tree, and itself, join the softmax: out = (e^lse * out + sum_a e^score_a * v_a) / (e^lse +
  // sum_a e^score_a), all relative to the largest exponent. Their keys and values are read back from
  // the cache, as the context's are, so a node sees what the same path run as a chain would.
  void attend_ancestors(std::size_t il) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
    const std::size_t group = c.n_head / c.n_head_kv;
    const auto add_ancestors = [&](std::size_t t, std::vector<float>& keys, std::vector<float>& values, std::vector<std::size_t>& path,
                                   std::vector<float>& score) {
      path.clear();
      for (std::uint64_t bits = batch.tree_ancestors[t]; bits; bits &= bits - 1) {
        path.push_back(static_cast<std::size_t>(batch.tree_context[t]) + static_cast<std::size_t>(std::countr_zero(bits)));
      }
      keys.resize(path.size() * KVD);
      values.resize(path.size() * KVD);
      for (std::size_t i = 0; i < path.size(); ++i) cache.read(il, batch.seq_ids[t], path[i], &keys[i * KVD], &values[i * KVD]);
      score.resize(path.size());
      for (std::size_t h = 0; h < c.n_head; ++h) {
        const float* q = &s.q[t * QD + h * HD];
        float* out = &s.attn[t * QD + h * HD];
        const std::size_t kv_head = h / group;
        float top = s.lse[t * c.n_head + h];
        const std::size_t n = path.size();
        for (std::size_t i = 0; i < n; ++i) {
          const float* key = &keys[i * KVD + kv_head * HD];
          float dot = 0.0f;
          for (std::size_t d = 0; d < HD; ++d) dot += q[d] * key[d];
          score[i] = dot * scale;
          if (c.attn_softcap > 0.0f) score[i] = c.attn_softcap * std::tanh(score[i] / c.attn_softcap);
          top = std::max(top, score[i]);
        }
        const float context_weight = std::exp(s.lse[t * c.n_head + h] - top);  // 0 for an empty context (-inf)
        float sum = context_weight;
        for (std::size_t d = 0; d < HD; ++d) out[d] *= context_weight;
        for (std::size_t i = 0; i < n; ++i) {
          const float w = std::exp(score[i] - top);
          sum += w;
          const float* value = &values[i * KVD + kv_head * HD];
          for (std::size_t d = 0; d < HD; ++d) out[d] += w * value[d];
        }
        for (std::size_t d = 0; d < HD; ++d) out[d] /= sum;
      }
    };
    // A few dozen dot products a node: on this thread, where waking the pool's workers (once a
    // layer) cost more than the work.
    thread_local std::vector<float> keys, values, score;
    thread_local std::vector<std::size_t> path;
    for (std::size_t t = 0; t < T; ++t) {
      if (batch.tree_context[t] >= 0) add_ancestors(t, keys, values, path, score);
    }
  }

  // The FFN sublayer: (attention output joins the residual stream) norm, then the dense gated FFN or
  // the mixture of experts -> tmp.
  void feed_forward(std::size_t il) {
    const LayerWeights& L = m.layers_[il];
    const kernels::WeightMatrix* gate_up[] = {&L.w_gate, &L.w_up};
    kernels::Activations ffn_in(s.xn.data(), T, D, s.ffn_act);  // quantized once for gate and up
    const bool quantize_ffn_in = !c.is_moe() && ffn_in.begin_quantize_for(gate_up);
    per_token([&](std::size_t t) {
      add_residual(t, L.post_attn_norm);
      kernels::rmsnorm(&s.x[t * D], L.ffn_norm, D, c.rms_eps, &s.xn[t * D]);
      if (quantize_ffn_in) ffn_in.quantize_token(t);
    });
    if (c.is_moe()) {
      m.moe_ffn(L, s.xn.data(), T, s.tmp.data(), pool);
      if (m.tp_) m.tp_->all_reduce_sum(s.tmp.data(), T * D);
      return;
    }
    if (quantize_ffn_in) ffn_in.end_quantize(pool);
    float* const gate_up_out[] = {s.gate.data(), s.up.data()};
    kernels::matmul_fused(gate_up, ffn_in, gate_up_out, pool);
    kernels::Activations down_in(s.gate.data(), T, F, s.down_act);
    const kernels::WeightMatrix* down[] = {&L.w_down};
    const bool quantize_down_in = down_in.begin_quantize_for(down);
    const bool gelu = c.desc->activation == arch::Activation::GeluTanh;
    per_token([&](std::size_t t) {
      if (gelu) {
        kernels::gelu_tanh_mul(&s.gate[t * F], &s.up[t * F], F);
      } else {
        kernels::silu_mul(&s.gate[t * F], &s.up[t * F], F);
      }
      if (quantize_down_in) down_in.quantize_token(t);
    });
    if (quantize_down_in) down_in.end_quantize(pool);
    kernels::matmul(L.w_down, down_in, s.tmp.data(), pool);
    if (m.tp_) m.tp_->all_reduce_sum(s.tmp.data(), T * D);  // each rank's FFN columns' share
  }

  // The last FFN output joins the stream; the sequences' lengths move on; the rows that want logits
  // get the final norm, the output projection (only they pay for it) and the final soft-cap.
  void finish(std::vector<float>& logits) {
    per_token([&](std::size_t t) { add_residual(t, m.layers_.back().post_ffn_norm); });
    for (std::size_t t = 0; t < T; ++t) {
      const std::size_t len = slot(t) + 1;
      if (len > cache.length(batch.seq_ids[t])) cache.set_length(batch.seq_ids[t], len);
    }
    std::size_t n_out = 0;
    for (std::size_t t = 0; t < T; ++t) {
      if (batch.want_logits[t]) kernels::rmsnorm(&s.x[t * D], m.output_norm_, D, c.rms_eps, &s.xn[n_out++ * D]);
    }
    // Tensor-parallel: this rank's vocabulary rows, gathered on rank 0 (whose logits the caller reads).
    std::vector<float>& out = m.tp_ ? s.rank_logits : logits;
    out.resize(n_out * m.vocab_part_.size());
    if (n_out) kernels::matmul(m.output_, s.xn.data(), n_out, out.data(), pool);
    if (c.final_softcap > 0.0f) {
      for (float& l : out) l = c.final_softcap * std::tanh(l / c.final_softcap);
    }
    if (m.tp_ && n_out) m.gather_logits(s.rank_logits, n_out, logits);
  }
};

void Model::check_batch(const Batch& batch) const {
  for (std::size_t t = 0; t < batch.size(); ++t) {
    if (batch.tokens[t] < 0 || static_cast<std::uint32_t>(batch.tokens[t]) >= config_.n_vocab) {
      throw Error("token id " + std::to_string(batch.tokens[t]) + " is outside the vocabulary of " + std::to_string(config_.n_vocab));
    }
    if (batch.positions[t] < 0) throw Error("negative position in batch");
    const std::int32_t context = batch.tree_context[t];
    if (context < 0 && batch.kv_slots[t] != batch.positions[t]) throw Error("internal: an ordinary batch token stored off its position");
    if (context >= 0) {
      const std::int32_t node = batch.kv_slots[t] - context;
      const std::uint64_t ancestors = batch.tree_ancestors[t];
      // A tree grows after at least one token (its root, whose logits predict the first level).
      if (context < 1 || node < 0 || node >= static_cast<std::int32_t>(Batch::kMaxTreeNodes) || !(ancestors >> node & 1) ||
          (ancestors >> node) != 1 || batch.positions[t] != context - 1 + std::popcount(ancestors)) {
        throw Error("internal: tree node " + std::to_string(t) + " of the batch has an inconsistent slot, ancestors or position");
      }
      // The ancestors' positions are taken to lie within every sliding window.
      if (config_.sliding_window && config_.sliding_window <= Batch::kMaxTreeNodes) throw Error("token trees need a sliding window over 64 positions");
    }
  }
}

bool Model::forward(const Batch& batch, KvCache& cache, ThreadPool& pool, std::vector<float>& logits,
                    const std::function<bool(std::size_t layer)>& stop_before, backend::DeviceSampling* sampling) const {
  if (tp_ && tp_->rank() != 0) throw Error("internal: a tensor-parallel rank other than 0 runs the passes rank 0 sends (follow_steps)");
  if (sampling) sampling->tokens.clear();
  if (device_) {
    logits.clear();
    if (batch.size() == 0) return true;
    check_batch(batch);
    reserve_slots(batch, cache);
    if (!tp_) return device_->forward(batch, cache, logits, stop_before, sampling);
    // Each rank's device computes its heads' and FFN columns' share (summed across the ranks inside
    // the pass) and its rows of the vocabulary; the host samples, as the vocabulary is split.
    send_step(batch, cache);
    return device_pass_of_rank(batch, cache, logits);
  }
  return run_pass(batch, cache, pool, logits, tp_ ? nullptr : stop_before);
}

void Model::reserve_slots(const Batch& batch, KvCache& cache) {
  for (std::size_t t = 0; t < batch.size(); ++t) cache.reserve(batch.seq_ids[t], static_cast<std::size_t>(batch.kv_slots[t]) + 1);
}

bool Model::device_pass_of_rank(const Batch& batch, KvCache& cache, std::vector<float>& logits) const {
  thread_local std::vector<float> rank_logits;
  device_->forward(batch, cache, rank_logits, {}, nullptr);
  const auto n_out = static_cast<std::size_t>(std::count_if(batch.want_logits.begin(), batch.want_logits.end(), [](std::uint8_t w) { return w != 0; }));
  if (n_out) gather_logits(rank_logits, n_out, logits);
  return true;
}

bool Model::run_pass(const Batch& batch, KvCache& cache, ThreadPool& pool, std::vector<float>& logits,
                     const std::function<bool(std::size_t layer)>& stop_before) const {
  logits.clear();
  if (batch.size() == 0) return true;
  thread_local Scratch scratch;
  ForwardPass pass(*this, batch, cache, pool, scratch);
  pass.begin();
  for (std::size_t il = 0; il < config_.n_layer; ++il) {
    if (il > 0 && stop_before && stop_before(il)) return false;
    pass.attention(il);
    pass.feed_forward(il);
  }
  pass.finish(logits);
  return true;
}

void Model::attach_device(std::unique_ptr<backend::DeviceForward> device) { device_ = std::move(device); }

Model::~Model() {
  if (!tp_ || tp_->rank() != 0) return;
  try {  // the other ranks return from follow_steps
    tensor_parallel::Step stop;
    stop.command = tensor_parallel::Step::Command::Stop;
    std::vector<std::int64_t> words = stop.encode();
    std::int64_t n = static_cast<std::int64_t>(words.size());
    tp_->broadcast(&n, sizeof n);
    tp_->broadcast(words.data(), words.size() * sizeof(std::int64_t));
  } catch (const std::exception&) {
    // The group failed already; the other ranks are gone or will be stopped by mpirun.
  }
}

void Model::send_step(const Batch& batch, KvCache& cache) const {
  tensor_parallel::Step step;
  const BlockPool& kv = cache.pool();
  step.cache_id = reinterpret_cast<std::uintptr_t>(&cache);
  step.cache.n_blocks = static_cast<std::int64_t>(kv.n_blocks());
  step.cache.max_positions = static_cast<std::int64_t>(cache.max_positions());
  step.cache.kv_type = static_cast<std::int64_t>(kv.type());
  step.cache.block_tokens = static_cast<std::int64_t>(kv.block_tokens());
  step.cache.segment_dim = static_cast<std::int64_t>(kv.segment_dim() == kv.kv_dim() ? 0 : kv.segment_dim());
  step.batch = batch;
  for (std::size_t t = 0; t < batch.size(); ++t) {
    const int seq = batch.seq_ids[t];
    if (std::none_of(step.sequences.begin(), step.sequences.end(), [&](const auto& s) { return s.seq == seq; })) {
      step.sequences.push_back({seq, cache.length(seq), cache.blocks(seq)});
    }
  }
  // A device repeats the copies itself before its pass (and takes them then); the CPU's are done.
  step.copies = device_ ? cache.pool().copies() : cache.pool().take_copies();
  const std::vector<std::int64_t> words = step.encode();
  std::int64_t n = static_cast<std::int64_t>(words.size());
  tp_->broadcast(&n, sizeof n);
  tp_->broadcast(const_cast<std::int64_t*>(words.data()), words.size() * sizeof(std::int64_t));
}

void Model::gather_logits(const std::vector<float>& rank_logits, std::size_t n_out, std::vector<float>& logits) const {
  thread_local std::vector<float> gathered;
  const int ranks = tp_->size();
  std::vector<std::size_t> counts(static_cast<std::size_t>(ranks)), offsets(static_cast<std::size_t>(ranks));
  std::size_t total = 0;
  for (int r = 0; r < ranks; ++r) {
    counts[static_cast<std::size_t>(r)] = n_out * tensor_parallel::part_of(config_.n_vocab, r, ranks).size();
    offsets[static_cast<std::size_t>(r)] = total;
    total += counts[static_cast<std::size_t>(r)];
  }
  const bool root = tp_->rank() == 0;
  if (root) gathered.resize(total);
  tp_->gather(rank_logits.data(), n_out * vocab_part_.size(), root ? gathered.data() : nullptr, counts.data(), offsets.data());
  if (!root) return;
  const std::size_t V = config_.n_vocab;
  logits.resize(n_out * V);
  for (int r = 0; r < ranks; ++r) {  // [rank][row][its vocabulary part] -> [row][vocabulary]
    const tensor_parallel::Part p = tensor_parallel::part_of(V, r, ranks);
    for (std::size_t i = 0; i < n_out; ++i) {
      std::copy_n(&gathered[offsets[static_cast<std::size_t>(r)] + i * p.size()], p.size(), &logits[i * V + p.first]);
    }
  }
}

void Model::follow_steps(ThreadPool& pool) const {
  if (!tp_ || tp_->rank() == 0) throw Error("internal: follow_steps is for the tensor-parallel ranks other than 0");
  struct Cache {
    tensor_parallel::Step::CacheGeometry geometry;
    std::unique_ptr<KvCache> kv;
  };
  std::unordered_map<std::uint64_t, Cache> caches;  // rank 0's caches by identity
  std::vector<std::int64_t> words;
  std::vector<float> logits;
  for (;;) {
    std::int64_t n = 0;
    tp_->broadcast(&n, sizeof n);
    if (n <= 0 || n > (std::int64_t{1} << 32)) throw Error("tensor parallelism: a malformed step header from rank 0");
    words.resize(static_cast<std::size_t>(n));
    tp_->broadcast(words.data(), words.size() * sizeof(std::int64_t));
    const tensor_parallel::Step step = tensor_parallel::Step::decode(words);
    if (step.command == tensor_parallel::Step::Command::Stop) return;
    Cache& c = caches[step.cache_id];
    const tensor_parallel::Step::CacheGeometry& g = step.cache;
    if (!c.kv || c.geometry != g) {
      if (g.kv_type < 0 || g.kv_type > static_cast<std::int64_t>(KvType::Q8_0)) throw Error("tensor parallelism: an unknown KV type from rank 0");
      c.kv = std::make_unique<KvCache>(KvCache::with_blocks(config_.n_layer, config_.kv_dim(), static_cast<std::size_t>(g.n_blocks),
                                                            static_cast<std::size_t>(g.max_positions), static_cast<KvType>(g.kv_type),
                                                            static_cast<std::size_t>(g.block_tokens), static_cast<std::size_t>(g.segment_dim)));
      c.geometry = g;
      if (device_) device_->attach_kv(*c.kv);  // from here on the pool logs the copies replayed below
    }
    KvCache& kv = *c.kv;
    for (const BlockPool::RowCopy& copy : step.copies) kv.pool().replay(copy);  // in rank 0's order: moves may overlap
    for (const tensor_parallel::Step::Sequence& s : step.sequences) kv.mirror(s.seq, s.blocks, s.length);
    if (device_) {
      reserve_slots(step.batch, kv);
      device_pass_of_rank(step.batch, kv, logits);
    } else {
      run_pass(step.batch, kv, pool, logits, {});
    }
    for (const tensor_parallel::Step::Sequence& s : step.sequences) kv.forget(s.seq);
  }
}

void Model::moe_ffn(const LayerWeights& L, const float* xn, std::size_t T, float* out, ThreadPool& pool) const {
  const ModelConfig& c = config_;
  const std::size_t D = c.n_embd, F = c.n_ff_expert, E = c.n_expert, K = c.n_expert_used;
  // Scratch kept across calls, as in forward.
  struct MoeScratch {
    std::vector<float> router_logits, in, gate, up, down;
    std::vector<ExpertChoice> choices;
    std::vector<std::vector<std::pair<std::size_t, float>>> by_expert;  // (token, weight) per expert
  };
  thread_local MoeScratch scratch;
  auto& s = scratch;
  s.router_logits.resize(T * E);
  kernels::matmul(L.router, xn, T, s.router_logits.data(), pool);
  s.choices.resize(T * K);
  s.by_expert.resize(E);
  for (auto& tokens : s.by_expert) tokens.clear();
  for (std::size_t t = 0; t < T; ++t) {
    route_experts(&s.router_logits[t * E], c.n_expert, c.n_expert_used, c.desc->router, c.expert_weights_norm, &s.choices[t * K]);
    for (std::size_t j = 0; j < K; ++j) s.by_expert[s.choices[t * K + j].expert].emplace_back(t, s.choices[t * K + j].weight);
  }
  std::fill_n(out, T * D, 0.0f);
  // Each chosen expert runs once over all of its tokens (prefill: one GEMM per expert; decode: only
  // the chosen experts' weights are read).
  for (std::size_t e = 0; e < E; ++e) {
    const auto& tokens = s.by_expert[e];
    const std::size_t n = tokens.size();
    if (n == 0) continue;
    s.in.resize(n * D);
    s.gate.resize(n * F);
    s.up.resize(n * F);
    s.down.resize(n * D);
    for (std::size_t j = 0; j < n; ++j) std::copy_n(xn + tokens[j].first * D, D, &s.in[j * D]);
    kernels::Activations in(s.in.data(), n, D);
    const kernels::WeightMatrix* gate_up[] = {&L.exp_gate[e], &L.exp_up[e]};
    float* const gate_up_out[] = {s.gate.data(), s.up.data()};
    kernels::matmul_fused(gate_up, in, gate_up_out, pool);
    for (std::size_t j = 0; j < n; ++j) {
      if (c.desc->activation == arch::Activation::GeluTanh) {
        kernels::gelu_tanh_mul(&s.gate[j * F], &s.up[j * F], F);
      } else {
        kernels::silu_mul(&s.gate[j * F], &s.up[j * F], F);
      }
    }
    kernels::matmul(L.exp_down[e], s.gate.data(), n, s.down.data(), pool);
    for (std::size_t j = 0; j < n; ++j) {
      float* o = out + tokens[j].first * D;
      const float w = tokens[j].second;
      for (std::size_t i = 0; i < D; ++i) o[i] += w * s.down[j * D + i];
    }
  }
}

}  // namespace promptly
