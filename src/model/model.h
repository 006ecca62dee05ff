#pragma once
// The decoder-only transformer of every architecture in model/arch/ (llama, mistral, mixtral, qwen2,
// qwen3, qwen3moe, gemma2, gemma3, phi3): one layer loop, built from the architecture's description.
// Weights are used in place from the mapped GGUF file in their stored type; the forward pass reads
// like the math and leaves speed to the kernels.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/matmul.h"
#include "kv/kv_cache.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/tensor_parallel.h"
#include "parallel/communicator.h"
#include "util/huge_pages.h"
#include "util/thread_pool.h"

namespace promptly {
namespace backend {
class DeviceForward;
struct DeviceSampling;
}

struct LayerWeights {
  // Fused files (phi3's attn_qkv, ffn_up with gate and up) are bound as views of their row ranges.
  kernels::WeightMatrix wq, wk, wv, wo, w_gate, w_up, w_down;  // w_gate/up/down: dense FFN only
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float* bq = nullptr;  // QKV biases (qwen2); null when absent
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;  // per-head RMSNorm weights (head_dim), qwen3 / gemma3
  const float* k_norm = nullptr;
  const float* post_attn_norm = nullptr;  // norms of the sublayers' outputs (gemma2 / gemma3)
  const float* post_ffn_norm = nullptr;
  // Mixture of experts: the router (n_expert rows) and each expert's matrices, views of the
  // stacked ffn_{gate,up,down}_exps tensors.
  kernels::WeightMatrix router;
  std::vector<kernels::WeightMatrix> exp_gate, exp_up, exp_down;
  bool local = false;  // sliding-window attention (see ModelConfig::layer_is_local)
};

// The type the model's kernels read a matrix stored as `stored` in: Q5_0's and IQ4_NL's exact Q8_0,
// or, where the CPU reads the matrix in the file's layout (cpu_plain: no AVX-512 repacking, no
// device), Q3_K's exact Q6_K (see Model::convert_matrices); else the stored type. What a decode
// step streams, and so its floor.
DType kernel_type_of(DType stored, bool cpu_plain);

struct ModelLoadOptions {
  // Converts the float matrices (F32, F16, BF16; the token embedding table and norms stay) to this
  // type as they load, into memory of the model's own. For a draft model, whose numbers only steer
  // which tokens are guessed: a Q8_0 draft streams half an F16 one's bytes at the same guesses
  // (README, Speculative decoding). Q8_0, Q4_0, Q4_K or Q6_K. (Q5_0 and IQ4_NL matrices always load
  // as Q8_0, and Q3_K ones the CPU reads unrepacked as Q6_K, exactly: see convert_matrices.)
  std::optional<DType> float_matrices_as;
  // Leaves every matrix as the file stores it (no repacking into the CPU kernels' layouts): for a
  // device backend that uploads the file's blocks (backend::place_on_device). The CPU forward pass
  // still runs, on the plain layouts.
  bool keep_file_layout = false;
};

class Model {
 public:
  // Loads and validates every tensor; throws Error naming the tensor and what is wrong.
  //
  // With a tensor-parallel group (`tp`, see model/tensor_parallel.h) this process keeps only its
  // rank's slices, config() describes those (its share of the heads and FFN columns), and rank 0's
  // forward passes run on every rank: the other ranks call follow_steps.
  explicit Model(std::shared_ptr<const gguf::File> file, std::shared_ptr<parallel::Communicator> tp = nullptr,
                 const ModelLoadOptions& options = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  // The whole model's hyper-parameters (config() unless tensor-parallel).
  const ModelConfig& full_config() const { return full_config_; }
  parallel::Communicator* tensor_parallel() const { return tp_.get(); }
  // Ranks other than 0: runs the forward passes rank 0 starts, on a KV cache of this rank's heads
  // that mirrors rank 0's block tables, until rank 0's Model goes away (or the group fails: throws).
  void follow_steps(ThreadPool& pool) const;
  const gguf::File& file() const { return *file_; }

  // Runs the batch, appending K/V to `cache`, and writes the logits of each token whose
  // want_logits is set, in batch order, to `logits` (n_vocab floats per such token).
  //
  // Under tensor parallelism rank 0 calls this and the other ranks follow; stop_before is not asked
  // then (every rank would have to hear the answer at every layer).
  //
  // `stop_before(layer)`, when given, is asked before each layer after the first; if it says yes,
  // the pass ends there and returns false: the sequences' lengths stay as they were and `logits` is
  // empty. The rows already written at the batch's positions hold nothing anyone reads (they lie
  // past the lengths) until the same tokens run again and write the same values. This is how the
  // engine lets a waiting follow-up go ahead of a step already in flight.
  //
  // `sampling`, with a device attached (device()), names logit rows the device samples itself
  // (backend/device_draw.h): their tokens come back in sampling->tokens and those rows of `logits`
  // are left unwritten (the vocabulary-sized rows never cross to the host). On the CPU its tokens
  // are left empty and every row is written: the caller samples.
  bool forward(const Batch& batch, KvCache& cache, ThreadPool& pool, std::vector<float>& logits,
               const std::function<bool(std::size_t layer)>& stop_before = {}, backend::DeviceSampling* sampling = nullptr) const;
  // Throws Error for a batch no forward pass may run: a token outside the vocabulary, a negative
  // position, a token stored off its position, a tree node inconsistent with its tree. forward
  // checks every batch with it first, whether the pass runs here or on a device.
  void check_batch(const Batch& batch) const;

  // The sliding-window layers and their window, for a cache that keeps their KV apart and gives it
  // up behind the window (KvCache::release_behind_window); none without a window, or under tensor
  // parallelism (the other ranks would have to follow each release: not done yet).
  LocalLayers local_layers() const;

  // Hands every later forward pass to `device` (see backend/device.h); the model's host weights stay
  // mapped (a device may read them again), but no CPU kernel runs them.
  void attach_device(std::unique_ptr<backend::DeviceForward> device);
  backend::DeviceForward* device() const { return device_.get(); }
  // Whether forward takes a DeviceSampling: a device, with the whole vocabulary on it (not split
  // across tensor-parallel ranks).
  bool samples_on_device() const { return device_ && !tp_; }

  // The weights as loaded, for a device backend to upload.
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const kernels::WeightMatrix& token_embedding() const { return token_embd_; }
  const kernels::WeightMatrix& output() const { return output_; }
  const float* output_norm() const { return output_norm_; }
  // RoPE speeds (n_rot / 2): the global ones for a cache of max_positions (LongRoPE's long factors
  // past the original context), and the local layers' own (empty: they share the global ones).
  const std::vector<float>& rope_speeds_for(std::size_t max_positions) const {
    return !inv_freq_long_.empty() && max_positions > config_.rope_orig_ctx ? inv_freq_long_ : inv_freq_;
  }
  const std::vector<float>& local_rope_speeds() const { return inv_freq_local_; }
  // release_local: with local_layers() apart.
  KvCache make_cache(std::size_t max_positions, KvType type = KvType::F16, std::size_t max_sequences = 1,
                     bool release_local = false) const;

 private:
  std::shared_ptr<const gguf::File> file_;
  ModelConfig full_config_;
  ModelConfig config_;
  std::shared_ptr<parallel::Communicator> tp_;
  tensor_parallel::OwnedSlices owned_slices_;  // column slices of this rank's matrices (until repacked)
  tensor_parallel::Part vocab_part_{0, 0};     // the output rows this rank computes
  kernels::WeightMatrix token_embd_;
  kernels::WeightMatrix output_;
  const float* output_norm_ = nullptr;
  std::vector<LayerWeights> layers_;
  std::vector<float> inv_freq_;  // n_rot / 2 rope speeds, with llama3 frequency factors applied
  // LongRoPE's speeds with the long factors, for caches of more positions than the original
  // context (empty: no long factors).
  std::vector<float> inv_freq_long_;
  std::vector<float> inv_freq_local_;  // local layers' own speeds (gemma3); empty when they share inv_freq_
  HugePageBuffer repacked_;  // weights moved into kernel-friendly layouts
  HugePageBuffer converted_;  // matrices converted at load (convert_matrices) and not repacked
  std::unique_ptr<backend::DeviceForward> device_;  // set: passes run there (attach_device)

  struct ForwardPass;  // one call's steps (model.cpp)
  bool run_pass(const Batch& batch, KvCache& cache, ThreadPool& pool, std::vector<float>& logits,
                const std::function<bool(std::size_t layer)>& stop_before) const;
  void send_step(const Batch& batch, KvCache& cache) const;  // rank 0, tensor-parallel
  // Blocks for every batch token's KV slot, before a pass writes there (and before rank 0 sends the
  // block tables).
  static void reserve_slots(const Batch& batch, KvCache& cache);
  // Tensor-parallel with a device: this rank's pass on its device, its logit rows gathered on rank 0.
  bool device_pass_of_rank(const Batch& batch, KvCache& cache, std::vector<float>& logits) const;
  void gather_logits(const std::vector<float>& rank_logits, std::size_t n_out, std::vector<float>& logits) const;
  void repack_for_kernels();
  void convert_matrices(std::optional<DType> floats_to, bool keep_file_layout);
  std::vector<kernels::WeightMatrix*> layer_and_output_matrices();
  // out[t] = the layer's expert mixture for each of the T rows of xn (n_embd each).
  void moe_ffn(const LayerWeights& L, const float* xn, std::size_t T, float* out, ThreadPool& pool) const;
};

}  // namespace promptly
