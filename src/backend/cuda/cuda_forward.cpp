// The model's forward pass on a GPU: the same steps as Model::ForwardPass (model.cpp), each one a
// kernel (kernels.cuh), over weights uploaded as the file stores them and a paged KV store whose
// block ids are the host pool's.
//
// A step: the host writes the batch's tokens, positions, slots and block tables into one pinned
// buffer, which goes up on the copy stream with the rows to sample on the device; the compute
// stream waits for it (an event), runs the layers and the sampler (sampling.cuh), whose tokens come
// back on the copy stream, and brings back only the other rows of logits that are wanted.
// Decode-sized batches (at most kGemvMaxTokens tokens) run as a CUDA graph captured once per shape
// (tokens, logit rows, attention chunk), since their hundreds of small launches would otherwise
// cost more than the work.
// Larger batches run their matmuls through cuBLAS: on halves (F32 weights in FP32); those up to
// gemv_batch_ tokens through the integer GEMV where it takes the weights' format.
#include "backend/cuda/cuda_forward.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cublas_loader.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/kv_store.h"
#include "backend/cuda/sampling.cuh"
#include "backend/cuda/step_layout.h"
#include "backend/cuda/step_profile.h"
#include "kv/kv_cache.h"
#include "model/batch.h"
#include "model/model.h"
#include "model/moe.h"
#include "parallel/communicator.h"

namespace promptly::backend::cuda {
namespace {

WeightFormat format_of(DType type, const std::string& what) {
  switch (type) {
    case DType::F32: return WeightFormat::F32;
    case DType::F16: return WeightFormat::F16;
    case DType::BF16: return WeightFormat::BF16;
    case DType::Q8_0: return WeightFormat::Q8_0;
    case DType::Q4_0: return WeightFormat::Q4_0;
    case DType::Q4_K: return WeightFormat::Q4_K;
    case DType::Q5_K: return WeightFormat::Q5_K;
    case DType::Q6_K: return WeightFormat::Q6_K;
    case DType::IQ4_XS: return WeightFormat::IQ4_XS;
    case DType::Q3_K: return WeightFormat::Q3_K;
    default: break;
  }
  throw Error("--device cuda: " + what + " is stored as " + std::string(dtype_name(type)) +
              ", which the GPU kernels do not read; run it on the CPU (without --device), or requantize it for the GPU "
              "(promptly quantize IN OUT Q8_0)");
}

bool env_is(const char* name, const char* value) {
  const char* set = std::getenv(name);
  return set && std::strcmp(set, value) == 0;
}

// The most tokens a pass sends through the integer GEMV by default (rounds of kGemvMaxTokens), an
// estimate until measured (docs/cuda-backend.md): the GEMV reads 4.5-bit Q4_K rows once where the
// GEMM reads 16-bit halves, but its dp4a work grows with the tokens; at Llama-3-8B's shape the two
// should cross between 25 and 50 tokens against kept halves (later where every pass decodes them).
constexpr int kGemvBatchDefault = 32;

int gemv_batch_from_env() {
  const char* set = std::getenv("PROMPTLY_CUDA_GEMV_BATCH");
  if (!set) return kGemvBatchDefault;
  char* end = nullptr;
  const long n = std::strtol(set, &end, 10);
  if (end == set || *end != '\0' || n < 1 || n > 1 << 20) {
    throw Error(std::string("PROMPTLY_CUDA_GEMV_BATCH=") + set + ": expected the most tokens a pass sends through the integer GEMV, a whole number (under " +
                std::to_string(kGemvMaxTokens) + " counts as " + std::to_string(kGemvMaxTokens) + ": cuBLAS for every batch past a decode step's)");
  }
  return std::max(static_cast<int>(n), kGemvMaxTokens);
}

// A matrix in device memory, as the file stores it.
struct MatrixView {
  const std::uint8_t* bytes = nullptr;
  WeightFormat format = WeightFormat::F32;
  int rows = 0, cols = 0;
  const __half* halves = nullptr;  // a quantized matrix decoded once for prefill's GEMMs, where kept
  const std::uint8_t* data() const { return bytes; }
};

struct DeviceMatrix {
  DeviceBuffer<std::uint8_t> bytes;
  DeviceBuffer<__half> halves;  // view.halves
  MatrixView view;
  operator const MatrixView&() const { return view; }
};

// One layer's experts of one kind (gate, up or down) in one allocation, expert after expert; where
// they share a format and shape (a GGUF's stacked tensor always does) at a fixed stride, by which
// the device-routed kernels find an expert's matrix from its index.
struct DeviceExperts {
  DeviceBuffer<std::uint8_t> bytes;
  std::vector<MatrixView> each;
  std::size_t stride = 0;  // 0: not uniform
  ExpertMatrices indexed(float* y) const { return {each.front().bytes, stride, each.front().format, y}; }
};

// Matrices of one width one under the other, as halves (F16 files' bytes, or the kept halves), for
// prefill's one GEMM of them all; view.rows 0 where they are not.
struct JoinedMatrices {
  MatrixView view;
  DeviceBuffer<std::uint8_t> bytes;  // F16 parts uploaded together (their own views point here)
  DeviceBuffer<__half> halves;       // their kept halves (keep_prefill_halves)
};

struct DeviceLayer {
  DeviceMatrix wq, wk, wv, wo, gate, up, down;
  // wq, wk and wv (qkv_with_post); gate and up (gate_up_activation).
  JoinedMatrices qkv, gate_up;
  DeviceMatrix router;                                // mixture of experts: n_expert rows
  DeviceExperts exp_gate, exp_up, exp_down;
  DeviceBuffer<float> attn_norm, ffn_norm, post_attn_norm, post_ffn_norm, q_norm, k_norm, bq, bk, bv;
  bool local = false;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (p_) cudaFreeHost(p_);
  }
  void reserve(std::size_t bytes) {
    if (bytes <= n_) return;
    if (p_) cudaFreeHost(std::exchange(p_, nullptr));
    PROMPTLY_CUDA_CHECK(cudaMallocHost(&p_, bytes));
    n_ = bytes;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

class CudaForward final : public DeviceForward {
 public:
  CudaForward(const Model& model, int index)
      : model_(model), c_(model.config()), tp_(model.tensor_parallel()), n_logits_(model.output().rows), device_(index) {
    if (c_.head_dim > static_cast<std::uint32_t>(kMaxHeadDim) || c_.head_dim % 2) {
      throw Error("--device cuda: heads of " + std::to_string(c_.head_dim) + " elements; the GPU attention takes even sizes up to " +
                  std::to_string(kMaxHeadDim));
    }
    // PROMPTLY_CUDA_GRAPHS=0 launches every kernel of every step (for compute-sanitizer, profilers,
    // and runtimes without graphs).
    use_graphs_ = !env_is("PROMPTLY_CUDA_GRAPHS", "0");
    // PROMPTLY_CUDA_GEMV=float keeps decode's products on the float kernel (x as floats), for
    // comparing it with the integer one (tools/gpu-check.sh times both).
    integer_gemv_ = !env_is("PROMPTLY_CUDA_GEMV", "float");
    // Batches past decode's (continuous batching's many streams, speculation's token trees, short
    // prompts) through the integer GEMV too, in rounds of kGemvMaxTokens tokens, up to this many
    // tokens; cuBLAS past them. PROMPTLY_CUDA_GEMV_BATCH=N sets it (at least kGemvMaxTokens: 8 is
    // cuBLAS for every batch past decode's), for finding the crossover (tools/gpu-check.sh).
    gemv_batch_ = gemv_batch_from_env();
    // Rope and the KV write in the q/k/v launch, the attention merge in the attention launch, the
    // gated activation in the gate/up launch (each finished by the last block to be done: three
    // launches fewer a decode layer); PROMPTLY_CUDA_FUSE=0 launches them on their own, for
    // comparing the two (tools/gpu-check.sh).
    fuse_ = !env_is("PROMPTLY_CUDA_FUSE", "0");
    // Prefill-sized batches' attention by tiles of a sequence's tokens that share each key and value
    // they load (kernels.cuh's attention_tiles), where the heads' size allows;
    // PROMPTLY_CUDA_ATTENTION_TILES=0 keeps them on the per-token kernel, for comparing the two
    // (tools/gpu-check.sh).
    attention_tiles_ = !env_is("PROMPTLY_CUDA_ATTENTION_TILES", "0") && attention_tiles_take(static_cast<int>(c_.head_dim));
    // Prefill's q, k and v products in one GEMM where wq, wk and wv lie one under the other as
    // halves (F16 files, kept halves): k and v are a quarter of q's rows each for grouped heads,
    // too few output tiles alone to fill the GPU; PROMPTLY_CUDA_JOINED_QKV=0 runs three GEMMs, for
    // comparing the two (tools/gpu-check.sh).
    joined_qkv_ = !env_is("PROMPTLY_CUDA_JOINED_QKV", "0");
    // Prefill's gate and up products in one GEMM likewise (twice the outputs: fewer partial waves of
    // output tiles; gated_activation reads the two halves of each row); PROMPTLY_CUDA_JOINED_GATE_UP=0
    // runs two GEMMs, for comparing the two (tools/gpu-check.sh).
    joined_gate_up_ = !env_is("PROMPTLY_CUDA_JOINED_GATE_UP", "0");
    // PROMPTLY_CUDA_PROFILE=1: each pass's time by stretch of kernels (step_profile.h), graphs off.
    if (env_is("PROMPTLY_CUDA_PROFILE", "1")) {
      profile_.enable();
      use_graphs_ = false;
    }
    PROMPTLY_CUDA_CHECK(cudaSetDevice(device_));
    cudaDeviceProp props{};
    PROMPTLY_CUDA_CHECK(cudaGetDeviceProperties(&props, device_));
    name_ = "cuda:" + std::to_string(device_);  // then what the device is and how it runs, below
    multiprocessors_ = props.multiProcessorCount;
    PROMPTLY_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    PROMPTLY_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    PROMPTLY_CUDA_CHECK(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming));
    PROMPTLY_CUDA_CHECK(cudaEventCreateWithFlags(&sampled_, cudaEventDisableTiming));
    for (cudaEvent_t& e : layer_done_) PROMPTLY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    // Programmatic dependent launches (kernels.cu's launch) where the device and driver take them;
    // PROMPTLY_CUDA_PDL=0 launches the ordinary way, for comparing the two (tools/gpu-check.sh).
    dependent_launches_ = !env_is("PROMPTLY_CUDA_PDL", "0") && props.major >= 9 && dependent_launches_work(compute_);
    upload_weights();
    // Whether every dense layer matrix is in a format the integer GEMV takes, for graphed (a fact
    // of the file: once here, not each step).
    layers_integer_ = !c_.is_moe();
    for (const DeviceLayer& L : layers_) {
      for (const DeviceMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) {
        layers_integer_ = layers_integer_ && gemv_q8_takes(m->view.format, m->view.cols);
      }
    }
    // A mixture of experts routes decode-sized batches on the device (moe_ffn_on_device), so that
    // their steps are graphs too, where its experts allow; PROMPTLY_CUDA_MOE=host routes them all on
    // the host (moe_ffn), which waits for the router once a layer and runs without graphs, for
    // comparing the two (tools/gpu-check.sh).
    moe_on_device_ = c_.is_moe() && !env_is("PROMPTLY_CUDA_MOE", "host") && experts_routable_on_device();
    if (c_.is_moe() && !moe_on_device_) use_graphs_ = false;
    // Tensor-parallel (model/tensor_parallel.h): this rank's slices, the sublayers' shares summed
    // across the ranks through the host mid-pass (reduce_across_ranks), which a graph cannot wait for.
    if (tp_) use_graphs_ = false;
    // The tiles' products on the tensor cores (halves in, float sums) where the heads' size allows,
    // except for a file of F32 matrices, which asked for full precision (as its GEMMs keep);
    // PROMPTLY_CUDA_ATTENTION_MMA=0 keeps them on the CUDA cores, for comparing the two
    // (tools/gpu-check.sh).
    attention_mma_ = attention_tiles_ && !env_is("PROMPTLY_CUDA_ATTENTION_MMA", "0") && attention_tiles_mma_take(static_cast<int>(c_.head_dim)) &&
                     !layers_.empty() && layers_.front().wq.view.format != WeightFormat::F32;
    const bool halves_kept = keep_prefill_halves();
    name_ += std::string(" (") + props.name + "; " + (use_graphs_ ? "graphs" : "no graphs") +
             (dependent_launches_ ? ", dependent launches" : "") + (halves_kept ? "; prefill from kept halves" : "") +
             (attention_mma_ ? "; prefill attention on tensor cores" : "") +
             (joined_qkv_ && !layers_.empty() && layers_.front().qkv.view.rows > 0 ? "; prefill q/k/v in one GEMM" : "") +
             (joined_gate_up_ && !layers_.empty() && layers_.front().gate_up.view.rows > 0 ? "; prefill gate/up in one GEMM" : "") +
             (integer_gemv_ ? "; integer GEMV up to " + std::to_string(gemv_batch_) + " tokens" : "") + ")";
  }

  ~CudaForward() override {
    cudaSetDevice(device_);
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    if (cublas_handle_) cublas().destroy(cublas_handle_);
    cudaEventDestroy(uploaded_);
    cudaEventDestroy(sampled_);
    for (cudaEvent_t e : layer_done_) cudaEventDestroy(e);
    cudaStreamDestroy(copy_);
    cudaStreamDestroy(compute_);
  }

  std::string name() const override { return name_; }
  std::string profile_report() const override { return profile_.report(); }
  std::string pci_bus_id() const override {
    char id[32] = {};
    PROMPTLY_CUDA_CHECK(cudaDeviceGetPCIBusId(id, sizeof id, device_));
    return id;
  }
  std::size_t weight_bytes() const override { return weight_bytes_; }

  std::size_t free_memory_bytes() const override {
    std::size_t free_bytes = 0, total = 0;
    PROMPTLY_CUDA_CHECK(cudaSetDevice(device_));
    PROMPTLY_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return free_bytes;
  }

  std::size_t kv_block_bytes(std::size_t block_tokens) const override {
    return static_cast<std::size_t>(c_.n_layer) * 2 * block_tokens * c_.kv_dim() * sizeof(__half);
  }

  void attach_kv(KvCache& cache) override {
    PROMPTLY_CUDA_CHECK(cudaSetDevice(device_));
    kv_state(cache);
  }

  double measure_bandwidth_gbs() override {
    PROMPTLY_CUDA_CHECK(cudaSetDevice(device_));
    constexpr std::size_t kBytes = std::size_t{1} << 30;  // far past any L2
    constexpr int kCopies = 10;
    DeviceBuffer<std::uint8_t> from(kBytes), to(kBytes);
    PROMPTLY_CUDA_CHECK(cudaMemsetAsync(from.get(), 1, kBytes, compute_));
    cudaEvent_t start = nullptr, stop = nullptr;
    PROMPTLY_CUDA_CHECK(cudaEventCreate(&start));
    PROMPTLY_CUDA_CHECK(cudaEventCreate(&stop));
    float ms = 0;
    for (int i = 0; i < 3; ++i) PROMPTLY_CUDA_CHECK(cudaMemcpyAsync(to.get(), from.get(), kBytes, cudaMemcpyDeviceToDevice, compute_));
    PROMPTLY_CUDA_CHECK(cudaEventRecord(start, compute_));
    for (int i = 0; i < kCopies; ++i) PROMPTLY_CUDA_CHECK(cudaMemcpyAsync(to.get(), from.get(), kBytes, cudaMemcpyDeviceToDevice, compute_));
    PROMPTLY_CUDA_CHECK(cudaEventRecord(stop, compute_));
    PROMPTLY_CUDA_CHECK(cudaEventSynchronize(stop));
    PROMPTLY_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return 2.0 * kCopies * static_cast<double>(kBytes) / (ms / 1e3) / 1e9;
  }

  bool forward(const Batch& batch, KvCache& cache, std::vector<float>& logits,
               const std::function<bool(std::size_t layer)>& stop_before, DeviceSampling* sampling) override {
    try {
      return forward_pass(batch, cache, logits, stop_before, sampling);
    } catch (...) {
      // The engine goes on to its next step after a failed one: nothing of this pass may still be
      // running then (its copies read pinned buffers the next step may reallocate).
      cudaStreamSynchronize(compute_);
      cudaStreamSynchronize(copy_);
      cudaGetLastError();
      throw;
    }
  }

 private:
  bool forward_pass(const Batch& batch, KvCache& cache, std::vector<float>& logits, const std::function<bool(std::size_t layer)>& stop_before,
                    DeviceSampling* sampling) {
    PROMPTLY_CUDA_CHECK(cudaSetDevice(device_));
    const DependentLaunches launches(dependent_launches_);
    const int T = static_cast<int>(batch.size());
    DeviceKvStore& kv = kv_state(cache);
    profile_.begin(compute_, T <= kGemvMaxTokens);
    const std::vector<BlockPool::RowCopy> copies = cache.pool().take_copies();
    if (kv.saves_in_flight()) kv.order_writes_after_saves(blocks_written(batch, cache, copies), compute_);  // the KV spool's copies back
    profile_.mark("kv copy-on-write replays");
    kv.replay(copies, compute_);
    const int longest = attention_span(batch);
    const AttentionShape shape = attention_shape(T, static_cast<int>(c_.n_head), longest, multiprocessors_, kMaxAttentionSplits);
    profile_.mark("step upload (waited for)");
    const int n_out = upload_step(batch, cache, shape.n_splits, longest, sampling);
    const int n_draws = sampling ? static_cast<int>(sampling->draws.size()) : 0;
    const bool long_rope = &model_.rope_speeds_for(cache.max_positions()) != &model_.rope_speeds_for(0);
    const float* inv_freq = long_rope ? inv_freq_long_.get() : inv_freq_.get();
    bool finished = true;
    // stop_before is not asked in a graph: it runs whole, and a decode step is short on a GPU.
    if (!graphed(T, n_out) || !run_graph(T, n_out, shape, kv, inv_freq)) finished = run_layers(T, n_out, shape, kv, inv_freq, stop_before);
    if (!finished) {
      PROMPTLY_CUDA_CHECK(cudaStreamSynchronize(compute_));
      profile_.end(false);
      return false;
    }
    profile_.mark("sampling");
    if (n_draws > 0) {
      // The drawn tokens come back on the copy stream while the other rows' logits (if any) come
      // back on the compute stream.
      sample_rows(logits_.get(), static_cast<int>(n_logits_), draws_.get(), n_draws, drawn_.get(), compute_);
      PROMPTLY_CUDA_CHECK(cudaEventRecord(sampled_, compute_));
      PROMPTLY_CUDA_CHECK(cudaStreamWaitEvent(copy_, sampled_, 0));
      PROMPTLY_CUDA_CHECK(cudaMemcpyAsync(pinned_drawn_.as<std::int32_t>(), drawn_.get(), n_draws * sizeof(std::int32_t),
                                          cudaMemcpyDeviceToHost, copy_));
    }
    profile_.mark("logits to the host");
    const std::size_t row_bytes = n_logits_ * sizeof(float);
    host_logits_.reserve(static_cast<std::size_t>(n_out) * row_bytes);
    for (int r = 0; r < n_out;) {  // runs of rows not drawn
      if (row_drawn_[r]) {
        ++r;
        continue;
      }
      int end = r + 1;
      while (end < n_out && !row_drawn_[end]) ++end;
      const std::size_t offset = static_cast<std::size_t>(r) * n_logits_;
      PROMPTLY_CUDA_CHECK(cudaMemcpyAsync(host_logits_.as<float>() + offset, logits_.get() + offset, (end - r) * row_bytes,
                                          cudaMemcpyDeviceToHost, compute_));
      r = end;
    }
    PROMPTLY_CUDA_CHECK(cudaStreamSynchronize(compute_));
    PROMPTLY_CUDA_CHECK(cudaStreamSynchronize(copy_));
    PROMPTLY_CUDA_CHECK(cudaGetLastError());
    profile_.end(true);
    logits.resize(static_cast<std::size_t>(n_out) * n_logits_);
    for (int r = 0; r < n_out; ++r) {
      if (row_drawn_[r]) continue;
      const float* row = host_logits_.as<float>() + static_cast<std::size_t>(r) * n_logits_;
      std::copy(row, row + n_logits_, logits.begin() + static_cast<std::ptrdiff_t>(r) * n_logits_);
    }
    if (n_draws > 0) sampling->tokens.assign(pinned_drawn_.as<std::int32_t>(), pinned_drawn_.as<std::int32_t>() + n_draws);
    for (int t = 0; t < T; ++t) {  // as Model::ForwardPass::finish
      const std::size_t len = static_cast<std::size_t>(batch.kv_slots[t]) + 1;
      if (len > cache.length(batch.seq_ids[t])) cache.set_length(batch.seq_ids[t], len);
    }
    return true;
  }

  // ---- loading -------------------------------------------------------------------------------
  // m's format and shape, checked (its bytes not yet anywhere).
  static MatrixView describe(const kernels::WeightMatrix& m, const std::string& what) {
    if (m.layout != kernels::Layout::Plain) throw Error("internal: " + what + " was repacked for the CPU before its upload");
    MatrixView view{nullptr, format_of(m.type, what), static_cast<int>(m.rows), static_cast<int>(m.cols)};
    // Block formats' rows are whole blocks by construction (GGUF); float rows may have any length.
    if (m.cols % 32 && !is_float_format(view.format)) {
      throw Error("--device cuda: " + what + " has rows of " + std::to_string(m.cols) + " elements, not whole 32-element chunks");
    }
    return view;
  }
  void upload(const kernels::WeightMatrix& m, DeviceMatrix& out, const std::string& what) {
    if (!m.data) return;
    out.bytes = DeviceBuffer<std::uint8_t>(m.rows * m.row_stride());
    upload_to(m, out, what, out.bytes.get());
  }
  // m's bytes to `at` (room for them), out's view of them there.
  void upload_to(const kernels::WeightMatrix& m, DeviceMatrix& out, const std::string& what, std::uint8_t* at) {
    out.view = describe(m, what);
    const std::size_t bytes = m.rows * m.row_stride();
    PROMPTLY_CUDA_CHECK(cudaMemcpy(at, m.data, bytes, cudaMemcpyHostToDevice));
    out.view.bytes = at;
    weight_bytes_ += bytes;
  }
  // Matrices of an F16 file that prefill multiplies by the same x (wq, wk, wv; gate, up) in one
  // allocation, one under the other, so that one GEMM takes them all (joined.view); otherwise
  // each on its own.
  void upload_joined(std::initializer_list<const kernels::WeightMatrix*> parts, std::initializer_list<DeviceMatrix*> outs,
                     std::initializer_list<std::string> names, JoinedMatrices& joined) {
    const kernels::WeightMatrix& first = **parts.begin();
    bool together = true;
    std::size_t total = 0;
    for (const kernels::WeightMatrix* m : parts) {
      together = together && m->data && m->type == DType::F16 && m->layout == kernels::Layout::Plain && m->cols == first.cols;
      total += m->rows * m->row_stride();
    }
    if (together) joined.bytes = DeviceBuffer<std::uint8_t>(total);
    std::size_t offset = 0;
    int rows = 0;
    auto out = outs.begin();
    auto name = names.begin();
    for (const kernels::WeightMatrix* m : parts) {
      if (together) {
        upload_to(*m, **out, *name, joined.bytes.get() + offset);
      } else {
        upload(*m, **out, *name);
      }
      offset += m->rows * m->row_stride();
      rows += static_cast<int>(m->rows);
      ++out, ++name;
    }
    if (together) joined.view = {joined.bytes.get(), WeightFormat::F16, rows, static_cast<int>(first.cols), nullptr};
  }
  void upload(const std::vector<kernels::WeightMatrix>& experts, DeviceExperts& out, const std::string& what) {
    if (experts.empty()) return;
    std::vector<std::size_t> offsets;
    std::size_t total = 0;
    bool uniform = true;
    for (std::size_t e = 0; e < experts.size(); ++e) {
      const kernels::WeightMatrix& m = experts[e];
      out.each.push_back(describe(m, what + " (expert " + std::to_string(e) + ")"));
      offsets.push_back(total);
      total += m.rows * m.row_stride();
      const MatrixView& first = out.each.front();
      uniform = uniform && out.each.back().format == first.format && out.each.back().rows == first.rows && out.each.back().cols == first.cols;
    }
    out.bytes = DeviceBuffer<std::uint8_t>(total);
    for (std::size_t e = 0; e < experts.size(); ++e) {
      const kernels::WeightMatrix& m = experts[e];
      PROMPTLY_CUDA_CHECK(cudaMemcpy(out.bytes.get() + offsets[e], m.data, m.rows * m.row_stride(), cudaMemcpyHostToDevice));
      out.each[e].bytes = out.bytes.get() + offsets[e];
    }
    out.stride = uniform ? total / experts.size() : 0;
    weight_bytes_ += total;
  }
  void upload(const float* v, std::size_t n, DeviceBuffer<float>& out) {
    if (!v) return;
    out = DeviceBuffer<float>(n);
    PROMPTLY_CUDA_CHECK(cudaMemcpy(out.get(), v, n * sizeof(float), cudaMemcpyHostToDevice));
    weight_bytes_ += n * sizeof(float);
  }

  void upload_weights() {
    const std::size_t D = c_.n_embd, QD = c_.q_dim(), KVD = c_.kv_dim(), HD = c_.head_dim;
    layers_.resize(c_.n_layer);
    for (std::size_t il = 0; il < c_.n_layer; ++il) {
      const LayerWeights& L = model_.layers()[il];
      DeviceLayer& d = layers_[il];
      const std::string blk = "blk." + std::to_string(il) + ".";
      upload_joined({&L.wq, &L.wk, &L.wv}, {&d.wq, &d.wk, &d.wv}, {blk + "attn_q", blk + "attn_k", blk + "attn_v"}, d.qkv);
      upload(L.wo, d.wo, blk + "attn_output");
      upload_joined({&L.w_gate, &L.w_up}, {&d.gate, &d.up}, {blk + "ffn_gate", blk + "ffn_up"}, d.gate_up);
      upload(L.w_down, d.down, blk + "ffn_down");
      upload(L.router, d.router, blk + "ffn_gate_inp");
      upload(L.exp_gate, d.exp_gate, blk + "ffn_gate_exps"), upload(L.exp_up, d.exp_up, blk + "ffn_up_exps");
      upload(L.exp_down, d.exp_down, blk + "ffn_down_exps");
      upload(L.attn_norm, D, d.attn_norm), upload(L.ffn_norm, D, d.ffn_norm);
      upload(L.post_attn_norm, D, d.post_attn_norm), upload(L.post_ffn_norm, D, d.post_ffn_norm);
      upload(L.q_norm, HD, d.q_norm), upload(L.k_norm, HD, d.k_norm);
      upload(L.bq, QD, d.bq), upload(L.bk, KVD, d.bk), upload(L.bv, KVD, d.bv);
      d.local = L.local;
    }
    upload(model_.token_embedding(), token_embd_, "token_embd");
    // A tied output is the embedding table: the same bytes on the device too.
    const kernels::WeightMatrix& embedding = model_.token_embedding();
    output_tied_ = model_.output().data == embedding.data && model_.output().rows == embedding.rows;
    if (!output_tied_) upload(model_.output(), output_, "output");
    upload(model_.output_norm(), D, output_norm_);
    const auto& short_freq = model_.rope_speeds_for(0);
    upload(short_freq.data(), short_freq.size(), inv_freq_);
    // LongRoPE's long speeds, for caches past the original context (rope_speeds_for chooses by size).
    const auto& long_freq = model_.rope_speeds_for(std::size_t{1} << 40);
    upload(long_freq.data(), long_freq.size(), inv_freq_long_);
    if (!model_.local_rope_speeds().empty()) upload(model_.local_rope_speeds().data(), model_.local_rope_speeds().size(), inv_freq_local_);
  }

  // Prefill decodes each quantized matrix to halves for cuBLAS on every pass: it reads the quantized
  // bytes, writes 2 bytes an element and reads them back (for Llama-3-8B in Q4_K_M about 33 GB of
  // memory traffic a prefill, ~8 ms at 4 TB/s: estimated). Where the halves of every dense
  // layer matrix fit in a quarter of the memory free after the weights, they are decoded once here
  // and prefill's GEMMs read them; decode still streams the quantized bytes, and the KV budget
  // (free_memory_bytes) is what is left. PROMPTLY_CUDA_PREFILL_HALVES=0 never keeps them, =1
  // always (tools/gpu-check.sh times the first against the default). Returns whether they are kept.
  bool keep_prefill_halves() {
    std::vector<DeviceMatrix*> quantized;
    std::size_t bytes = 0;
    for (DeviceLayer& L : layers_) {
      for (DeviceMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) {
        if (!m->view.bytes || is_float_format(m->view.format)) continue;
        quantized.push_back(m);
        bytes += static_cast<std::size_t>(m->view.rows) * m->view.cols * sizeof(__half);
      }
    }
    if (quantized.empty() || env_is("PROMPTLY_CUDA_PREFILL_HALVES", "0")) return false;
    if (!env_is("PROMPTLY_CUDA_PREFILL_HALVES", "1") && bytes > free_memory_bytes() / 4) return false;
    const auto decode = [&](DeviceMatrix& m, __half* to) {
      dequantize_to_half(m.view.bytes, m.view.format, m.view.rows, m.view.cols, to, compute_);
      m.view.halves = to;
    };
    // wq, wk and wv, and gate and up, one under the other, for prefill's one GEMM of each group
    // (qkv_with_post, gate_up_activation).
    const auto decode_joined = [&](std::initializer_list<DeviceMatrix*> parts, JoinedMatrices& joined) {
      const MatrixView& first = (*parts.begin())->view;
      int rows = 0;
      for (const DeviceMatrix* m : parts) {
        if (!m->view.bytes || is_float_format(m->view.format) || m->view.cols != first.cols) return;
        rows += m->view.rows;
      }
      joined.halves = DeviceBuffer<__half>(static_cast<std::size_t>(rows) * first.cols);
      std::size_t offset = 0;
      for (DeviceMatrix* m : parts) {
        decode(*m, joined.halves.get() + offset);
        offset += static_cast<std::size_t>(m->view.rows) * m->view.cols;
      }
      joined.view = {first.bytes, first.format, rows, first.cols, joined.halves.get()};
    };
    for (DeviceLayer& L : layers_) {
      decode_joined({&L.wq, &L.wk, &L.wv}, L.qkv);
      decode_joined({&L.gate, &L.up}, L.gate_up);
    }
    for (DeviceMatrix* m : quantized) {
      if (m->view.halves) continue;  // joined above
      m->halves = DeviceBuffer<__half>(static_cast<std::size_t>(m->view.rows) * m->view.cols);
      decode(*m, m->halves.get());
    }
    PROMPTLY_CUDA_CHECK(cudaStreamSynchronize(compute_));
    PROMPTLY_CUDA_CHECK(cudaGetLastError());
    return true;
  }

  // ---- one step ------------------------------------------------------------------------------
  DeviceKvStore& kv_state(KvCache& cache) {
    if (auto* state = dynamic_cast<DeviceKvStore*>(cache.device_state())) return *state;
    auto state = std::make_unique<DeviceKvStore>(device_, static_cast<int>(c_.n_layer), static_cast<int>(c_.n_head_kv),
                                                 static_cast<int>(c_.head_dim), cache);
    // From here on the pool logs its copies (a prefix's last partial block copied before a
    // sequence writes into it), and each pass repeats them here first.
    cache.pool().take_copies();
    cache.pool().log_copies(true);
    DeviceKvStore& ref = *state;
    cache.set_device_state(std::move(state));
    graphs_clear();  // the graphs hold the previous cache's pointer
    return ref;
  }

  // The blocks a pass writes into: its tokens' and the copies' destinations.
  const std::vector<int>& blocks_written(const Batch& batch, const KvCache& cache, const std::vector<BlockPool::RowCopy>& copies) {
    written_.clear();
    for (std::size_t t = 0; t < batch.size(); ++t) {
      written_.push_back(cache.blocks(batch.seq_ids[t])[static_cast<std::size_t>(batch.kv_slots[t]) / cache.block_tokens()]);
    }
    for (const BlockPool::RowCopy& copy : copies) written_.push_back(copy.to);
    return written_;
  }

  // Sends the step's per-token facts and the rows to draw up (copies from pinned buffers, on the
  // copy stream, which the compute stream waits for); returns the number of rows that want logits.
  int upload_step(const Batch& batch, const KvCache& cache, int n_splits, int longest, const DeviceSampling* sampling) {
    const StepLayout layout = pack_step(batch, cache, step_host_, attention_tiles_ ? attention_tile_tokens(static_cast<int>(c_.head_dim)) : 0);
    const int T = layout.T;
    // The tokens in no attention tile (a decoding sequence's, beside a prompt) split their contexts
    // by their own count, as a decode step's would: one split over a long context would hold the
    // whole step up.
    lone_shape_ = attention_shape(layout.n_lone, static_cast<int>(c_.n_head), longest, multiprocessors_, kMaxAttentionSplits);
    const std::size_t split_queries = std::max(static_cast<std::size_t>(T) * n_splits,
                                               tiled_attention(T) ? static_cast<std::size_t>(layout.n_lone) * lone_shape_.n_splits : 0);
    ensure_capacity(T, layout.n_out, split_queries, step_host_.size());
    const std::size_t bytes = step_host_.size() * sizeof(std::int32_t);
    pinned_step_.reserve(bytes);
    // The previous step's upload must have left the pinned buffer before it is rewritten.
    PROMPTLY_CUDA_CHECK(cudaStreamSynchronize(copy_));
    std::memcpy(pinned_step_.as<std::int32_t>(), step_host_.data(), bytes);
    PROMPTLY_CUDA_CHECK(cudaMemcpyAsync(step_.get(), pinned_step_.as<std::int32_t>(), bytes, cudaMemcpyHostToDevice, copy_));
    upload_draws(sampling, layout.n_out);
    PROMPTLY_CUDA_CHECK(cudaEventRecord(uploaded_, copy_));
    PROMPTLY_CUDA_CHECK(cudaStreamWaitEvent(compute_, uploaded_, 0));
    const std::int32_t* d = step_.get();
    meta_ = {d + layout.tokens(),       d + layout.positions(),     d + layout.slots(),
             d + layout.table_starts(), d + layout.tables(),        d + layout.tree_contexts(),
             reinterpret_cast<const std::uint32_t*>(d + layout.tree_ancestors()), d + layout.tiles(), d + layout.lone()};
    out_rows_ = d + layout.out_rows();
    n_tiles_ = layout.n_tiles;
    n_lone_ = layout.n_lone;
    return layout.n_out;
  }

  // Called with the copy stream idle (upload_step).
  void upload_draws(const DeviceSampling* sampling, int n_out) {
    row_drawn_.assign(static_cast<std::size_t>(n_out), 0);
    if (!sampling || sampling->draws.empty()) return;
    const std::vector<DeviceDraw>& draws = sampling->draws;
    for (const DeviceDraw& d : draws) {
      if (d.row < 0 || d.row >= n_out || row_drawn_[d.row]) {
        throw Error("internal: a device draw names logit row " + std::to_string(d.row) + " of " + std::to_string(n_out) + ", or one drawn twice");
      }
      row_drawn_[d.row] = 1;
    }
    draws_.reserve(draws.size());
    drawn_.reserve(draws.size());
    pinned_draws_.reserve(draws.size() * sizeof(DeviceDraw));
    pinned_drawn_.reserve(draws.size() * sizeof(std::int32_t));
    std::memcpy(pinned_draws_.as<DeviceDraw>(), draws.data(), draws.size() * sizeof(DeviceDraw));
    PROMPTLY_CUDA_CHECK(cudaMemcpyAsync(draws_.get(), pinned_draws_.as<DeviceDraw>(), draws.size() * sizeof(DeviceDraw), cudaMemcpyHostToDevice, copy_));
  }

  // split_queries: the most (query, split) pairs of an attention launch.
  void ensure_capacity(int T, int n_out, std::size_t split_queries, std::size_t step_entries) {
    bool moved = false;
    const std::size_t t = static_cast<std::size_t>(T);
    // Twice the room a step needs when it grows: the block tables grow a block at a time, and each
    // move of this buffer retires the captured graphs.
    if (step_entries > step_.size()) moved |= step_.reserve(2 * step_entries + 1024);
    moved |= x_.reserve(t * c_.n_embd);
    moved |= xn_.reserve(t * c_.n_embd);
    moved |= tmp_.reserve(t * c_.n_embd);
    moved |= q_.reserve(t * c_.q_dim());
    moved |= attn_.reserve(t * c_.q_dim());
    moved |= k_.reserve(t * c_.kv_dim());
    moved |= v_.reserve(t * c_.kv_dim());
    // Prefill's products of joined matrices (never a graph's: cuBLAS's, never captured).
    if ((joined_qkv_ || joined_gate_up_) && T > kGemvMaxTokens) moved |= joined_.reserve(t * std::max<std::size_t>(c_.q_dim() + 2 * c_.kv_dim(), 2 * std::size_t{c_.n_ff}));
    const std::size_t ffn_width = std::max<std::size_t>(c_.n_ff, c_.n_ff_expert);
    // moe_ffn_on_device's (token, expert) pairs: their FFN rows in gate_/up_, outputs in expert_y_.
    const std::size_t pairs = moe_on_device_ && T <= kGemvMaxTokens ? t * c_.n_expert_used : 0;
    moved |= gate_.reserve(std::max(t * ffn_width, pairs * c_.n_ff_expert));
    moved |= up_.reserve(std::max(t * ffn_width, pairs * c_.n_ff_expert));
    if (c_.is_moe()) {
      moved |= router_logits_.reserve(t * c_.n_expert);
      moved |= expert_x_.reserve(t * c_.n_embd);
      moved |= expert_y_.reserve(std::max(t, pairs) * c_.n_embd);
      moved |= expert_routes_.reserve(2 * t * c_.n_expert_used);  // rows (or experts), then weights (floats)
    }
    moved |= out_x_.reserve(std::max<std::size_t>(static_cast<std::size_t>(n_out), 1) * c_.n_embd);
    moved |= logits_.reserve(std::max<std::size_t>(static_cast<std::size_t>(n_out), 1) * n_logits_);
    // The integer GEMV's x: allocated here, never while a graph is being captured.
    const std::size_t widest_input = std::max({std::size_t{c_.n_embd}, std::size_t{c_.q_dim()}, ffn_width});
    moved |= x_q8_.reserve(std::max(t * widest_input, pairs * c_.n_ff_expert));
    moved |= x_q8_scales_.reserve(std::max(t * widest_input, pairs * c_.n_ff_expert) / 32 + 1);
    moved |= partials_.reserve(split_queries * c_.n_head * (c_.head_dim + 2));
    // The fused launches' counters: zero when made, and each launch leaves them zero.
    const std::size_t arrivals = std::max({attention_arrivals_needed(T, static_cast<int>(c_.n_head)), gated_arrivals_needed(static_cast<int>(c_.n_ff)),
                                           qkv_arrivals_needed(static_cast<int>(c_.n_head), static_cast<int>(c_.n_head_kv)),
                                           pairs * gated_arrivals_needed(static_cast<int>(c_.n_ff_expert))});
    if (arrivals_.reserve(arrivals)) {
      PROMPTLY_CUDA_CHECK(cudaMemsetAsync(arrivals_.get(), 0, arrivals_.size() * sizeof(int), compute_));
      moved = true;
    }
    const std::size_t activations = std::max(t * c_.n_ff, pairs * c_.n_ff_expert);
    moved |= act_q8_.reserve(activations);
    moved |= act_q8_scales_.reserve(activations / 32 + 1);
    if (moved) graphs_clear();
  }

  void graphs_clear() {
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
  }

  // Whether this step runs as a CUDA graph: decode-sized batches (up to kGemvMaxTokens tokens);
  // past them, up to gemv_batch_ (many streams decoding at once, speculation's guesses), steps where
  // every product goes through the integer GEMV (cuBLAS is never captured), attention has no tiles
  // (every token takes the per-token kernel, whose shape is then the key's: n_lone_ = T), and a
  // dense model's FFN (a mixture of experts routes such batches on the host, mid-pass). Their
  // hundreds of small launches are what graphs save: at 8B's shape a 16-stream step is ~400 of them,
  // ~1-2 ms of the host's launch time against ~1.5-2.5 ms of GPU time (estimates).
  bool graphed(int T, int n_out) const {
    if (!use_graphs_) return false;
    if (T <= kGemvMaxTokens) return true;
    if (!graphs_past_decode_ || !layers_integer_ || !integer_gemv_ || T > gemv_batch_ || n_tiles_ > 0) return false;
    const MatrixView& output = output_tied_ ? token_embd_.view : output_.view;
    return n_out <= kGemvMaxTokens || integer_gemv_takes(output, n_out);
  }

  // Runs the step's layers as a graph, captured the first time its shape comes. Returns false
  // where a step past decode's batches could not be captured: it then runs without (the caller),
  // and so do all such steps after it, with a warning (a GPU may refuse what the CPU runs of this
  // code could not show); a decode step's failure is an error, as it always was.
  bool run_graph(int T, int n_out, AttentionShape shape, DeviceKvStore& kv, const float* inv_freq) {
    const auto key = std::make_tuple(T, n_out, shape.chunk, kv.desc().data, inv_freq);
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      cudaGraph_t graph = nullptr;
      PROMPTLY_CUDA_CHECK(cudaStreamBeginCapture(compute_, cudaStreamCaptureModeThreadLocal));
      cudaGraphExec_t exec = nullptr;
      try {
        run_layers(T, n_out, shape, kv, inv_freq, {});
        PROMPTLY_CUDA_CHECK(cudaStreamEndCapture(compute_, &graph));
        const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
        cudaGraphDestroy(graph);
        PROMPTLY_CUDA_CHECK(status);
      } catch (const std::exception& e) {
        cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
        cudaStreamIsCapturing(compute_, &capturing);
        if (capturing != cudaStreamCaptureStatusNone) {
          graph = nullptr;
          cudaStreamEndCapture(compute_, &graph);
          if (graph) cudaGraphDestroy(graph);
        }
        if (T <= kGemvMaxTokens) throw;
        cudaGetLastError();
        graphs_past_decode_ = false;
        std::fprintf(stderr, "warning: %s: a step of %d tokens could not be captured as a CUDA graph (%s); steps past %d tokens run without\n",
                     name_.c_str(), T, e.what(), kGemvMaxTokens);
        return false;
      }
      it = graphs_.emplace(key, exec).first;
    }
    PROMPTLY_CUDA_CHECK(cudaGraphLaunch(it->second, compute_));
    return true;
  }

  struct Product {
    MatrixView w;
    float* y;
  };
  // Where the kernel that writes a matmul's input should also write it as int8: where the integer
  // GEMV takes one of the matrices that read it (else nowhere: no int8 form wanted).
  Q8Out q8_for(int T, std::initializer_list<MatrixView> readers) const {
    if (T > kGemvMaxTokens || !integer_gemv_) return {};
    for (const MatrixView& m : readers) {
      if (gemv_q8_takes(m.format, m.cols)) return {x_q8_.get(), x_q8_scales_.get()};
    }
    return {};
  }

  // y[T x W.rows] = x[T x W.cols] W^T for each product, all reading the same x (q/k/v, gate/up):
  // for decode-sized batches the matrix-vector kernels (the integer one, in one launch, where it
  // takes the format; x quantized to int8 once for them all unless x_q8 holds it: the kernel that
  // wrote x wrote its int8 form too, q8_for), else cuBLAS on halves (x converted once for them all,
  // the weights decoded a slice of rows at a time; F32 weights in FP32).
  void matmul(std::initializer_list<Product> products, const float* x, int T, Q8Out x_q8 = {}) {
    bool x_in_half = false;
    GemvParts integer{};  // the products the integer GEMV takes: one launch for them all
    for (const Product& p : products) {
      if (integer_gemv_takes(p.w, T)) {
        integer.cols = p.w.cols;
        integer.part[integer.n++] = {p.w.data(), p.w.format, p.w.rows, p.y};
      } else if (T <= kGemvMaxTokens) {
        gemv(p.w.data(), p.w.format, p.w.rows, p.w.cols, x, T, p.y, compute_);
      } else {
        gemm(p.w, x, T, p.y, x_in_half);
      }
    }
    if (integer.n > 0) {
      if (!x_q8.q) x_q8 = quantized(x, T, integer.cols);
      gemv_q8(integer, x_q8.q, x_q8.scale_sum, T, compute_);
    }
  }

  // x (T rows of cols) as int8 for the integer GEMV, in x_q8_.
  Q8Out quantized(const float* x, int T, int cols) {
    quantize_q8(x, T, cols, x_q8_.get(), x_q8_scales_.get(), compute_);
    return {x_q8_.get(), x_q8_scales_.get()};
  }

  // What a pass of T tokens streams of these matrices through the matrix-vector kernels (the
  // profile's GB/s); the matrices cuBLAS takes count nothing (the GEMMs read halves).
  double streamed(int T, std::initializer_list<MatrixView> matrices) const {
    double bytes = 0.0;
    for (const MatrixView& m : matrices) {
      if (T <= kGemvMaxTokens || integer_gemv_takes(m, T)) bytes += static_cast<double>(m.rows) * static_cast<double>(format_row_bytes(m.format, m.cols));
    }
    return bytes;
  }

  // The q/k/v products and qkv_post's work (rope, the KV write): in one launch where all three go
  // through the integer GEMV (gemv_q8_qkv), else the products and then a launch of its own.
  void qkv_with_post(const DeviceLayer& L, int T, Q8Out xn_q8, const QkvPost& post, DeviceKvStore& kv) {
    GemvParts parts{};
    parts.n = 3, parts.cols = L.wq.view.cols;
    parts.part[0] = {L.wq.view.data(), L.wq.view.format, L.wq.view.rows, q_.get()};
    parts.part[1] = {L.wk.view.data(), L.wk.view.format, L.wk.view.rows, k_.get()};
    parts.part[2] = {L.wv.view.data(), L.wv.view.format, L.wv.view.rows, v_.get()};
    if (fuse_ && integer_gemv_ && T <= kGemvMaxTokens && gemv_q8_qkv_takes(parts, post)) {
      profile_.mark("q/k/v matmuls, rope, kv write", streamed(T, {L.wq, L.wk, L.wv}));
      if (!xn_q8.q) xn_q8 = quantized(xn_.get(), T, parts.cols);
      gemv_q8_qkv(parts, xn_q8.q, xn_q8.scale_sum, T, post, meta_, kv.desc(), arrivals_.get(), compute_);
      return;
    }
    profile_.mark("q/k/v matmuls", streamed(T, {L.wq, L.wk, L.wv}));
    if (joined_qkv_ && T > kGemvMaxTokens && L.qkv.view.rows > 0 && !any_integer_gemv(T, {L.wq, L.wk, L.wv})) {
      // One GEMM into joined_, a token's q, k and v in one row; qkv_post reads them there and writes
      // the rotated queries to q_.
      bool x_in_half = false;
      gemm(L.qkv.view, xn_.get(), T, joined_.get(), x_in_half);
      QkvPost joined = post;
      joined.q_in = joined_.get();
      joined.k = joined_.get() + L.wq.view.rows;
      joined.v = joined.k + L.wk.view.rows;
      joined.in_stride = L.qkv.view.rows;
      profile_.mark("q/k/v post (rope, kv write)");
      qkv_post(joined, meta_, T, kv.desc(), compute_);
      return;
    }
    matmul({{L.wq, q_.get()}, {L.wk, k_.get()}, {L.wv, v_.get()}}, xn_.get(), T, xn_q8);
    profile_.mark("q/k/v post (rope, kv write)");
    qkv_post(post, meta_, T, kv.desc(), compute_);
  }

  // The dense FFN's gate and up products and gate_ = act(gate) * up; returns where gate_'s int8
  // form is (for the down projection's integer GEMV), if anywhere. Where both products go through
  // the integer GEMV, the activation is that launch's end (GatedTail) and the int8 goes to
  // act_q8_ (x_q8_ is the launch's own input); else a launch of its own after them (after one
  // GEMM of gate and up joined, where both go to cuBLAS and lie one under the other).
  Q8Out gate_up_activation(const DeviceLayer& L, int T, Q8Out xn_q8) {
    const int F = static_cast<int>(c_.n_ff);
    const auto integer = [&](const MatrixView& m) { return integer_gemv_takes(m, T); };
    if (fuse_ && T <= kGemvMaxTokens && integer(L.gate.view) && integer(L.up.view) && L.gate.view.rows == L.up.view.rows) {
      profile_.mark("gate/up matmuls, gated activation", streamed(T, {L.gate, L.up}));
      if (!xn_q8.q) xn_q8 = quantized(xn_.get(), T, L.gate.view.cols);
      // The down projection takes int8 where the integer GEMV takes it (rows of whole blocks, then).
      const Q8Out q8_down = integer(L.down.view) ? Q8Out{act_q8_.get(), act_q8_scales_.get()} : Q8Out{};
      GemvParts parts{};
      parts.n = 2, parts.cols = L.gate.view.cols;
      parts.part[0] = {L.gate.view.data(), L.gate.view.format, F, gate_.get()};
      parts.part[1] = {L.up.view.data(), L.up.view.format, F, up_.get()};
      parts.gated = {arrivals_.get(), q8_down, gelu()};
      gemv_q8(parts, xn_q8.q, xn_q8.scale_sum, T, compute_);
      return q8_down;
    }
    profile_.mark("gate/up matmuls", streamed(T, {L.gate, L.up}));
    if (joined_gate_up_ && T > kGemvMaxTokens && L.gate_up.view.rows > 0 && !any_integer_gemv(T, {L.gate, L.up})) {
      // One GEMM into joined_, a token's gate then up products in one row of 2F; the activation
      // reads both halves and writes gate_ as the down projection reads it.
      bool x_in_half = false;
      gemm(L.gate_up.view, xn_.get(), T, joined_.get(), x_in_half);
      profile_.mark("gated activation");
      gated_activation_joined(joined_.get(), T, F, gelu(), gate_.get(), compute_);
      return {};  // past decode's batches: no int8 form (q8_for)
    }
    matmul({{L.gate, gate_.get()}, {L.up, up_.get()}}, xn_.get(), T, xn_q8);
    profile_.mark("gated activation");
    const Q8Out q8_down = q8_for(T, {L.down});
    gated_activation(gate_.get(), up_.get(), static_cast<std::size_t>(T) * F, gelu(), compute_, q8_down);
    return q8_down;
  }

  void gemm(const MatrixView& w, const float* x, int T, float* y, bool& x_in_half) {
    const CublasApi& api = cublas();
    if (!cublas_handle_) {
      if (api.create(&cublas_handle_) != CUBLAS_STATUS_SUCCESS) throw Error("cuBLAS: could not create a handle");
      api.set_stream(cublas_handle_, compute_);
    }
    const float alpha = 1.0f, beta = 0.0f;
    const auto gemm = [&](int rows, const void* a, cudaDataType type, const void* b, float* out) {
      // Column-major view: W^T's rows (rows x cols) times x^T (cols x T) into y^T at `out` (ld = W.rows).
      const cublasStatus_t status = api.gemm_ex(cublas_handle_, CUBLAS_OP_T, CUBLAS_OP_N, rows, T, w.cols, &alpha, a, type, w.cols, b, type,
                                                w.cols, &beta, out, CUDA_R_32F, w.rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (status != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cuBLAS: GemmEx failed: ") + api.status_string(status));
    };
    if (w.format == WeightFormat::F32) {  // full precision where the file asked for it (small models, tests)
      gemm(w.rows, w.data(), CUDA_R_32F, x, y);
      return;
    }
    if (!x_in_half) {
      const std::size_t n_x = static_cast<std::size_t>(T) * w.cols;
      x_half_.reserve(n_x);
      float_to_half(x, n_x, x_half_.get(), compute_);
      x_in_half = true;
    }
    if (w.halves) {  // decoded once at load (keep_prefill_halves)
      profile_.mark("prefill: cuBLAS GEMMs");
      gemm(w.rows, w.halves, CUDA_R_16F, x_half_.get(), y);
      return;
    }
    constexpr std::size_t kSliceElems = std::size_t{64} << 20;  // 128 MiB of halves at most
    const int slice_rows = w.format == WeightFormat::F16 ? w.rows
                                                          : static_cast<int>(std::max<std::size_t>(1, std::min<std::size_t>(w.rows, kSliceElems / w.cols)));
    if (w.format != WeightFormat::F16) w_half_.reserve(static_cast<std::size_t>(slice_rows) * w.cols);
    // The profile tells decoding from multiplying (what decoding costs a prefill is what keeping
    // the halves, or decoding inside the GEMM, would save).
    for (int r0 = 0; r0 < w.rows; r0 += slice_rows) {
      const int n = std::min(slice_rows, w.rows - r0);
      const void* a;
      if (w.format == WeightFormat::F16) {
        a = w.data();
      } else {
        profile_.mark("prefill: weights decoded to halves");
        dequantize_to_half(w.data() + format_row_bytes(w.format, w.cols) * r0, w.format, n, w.cols, w_half_.get(), compute_);
        a = w_half_.get();
      }
      profile_.mark("prefill: cuBLAS GEMMs");
      gemm(n, a, CUDA_R_16F, x_half_.get(), y + r0);
    }
  }

  // One matrix into tmp_ (the o or down projection; under tensor parallelism each rank's share,
  // summed across the ranks), then add_rmsnorm's work on it: x_ += tmp_ (through delta_norm where
  // the model norms its sublayers' outputs), xn_ = rmsnorm(x_) * weight, as int8 too where q8. For a
  // lone decoding stream whose matrix the integer GEMV takes, that work is the GEMV launch's end
  // (NormTail: one launch fewer on the step's critical path); otherwise a launch of its own, or
  // none yet where norm_otherwise is false (the caller's own launch does it). Returns whether the
  // norm was done. The profile names the stretch `stretch`, or `folded` where the norm ends the GEMV.
  bool project_and_norm(const char* stretch, const char* folded, const MatrixView& w, const float* in, int T, Q8Out in_q8,
                        const float* delta_norm, const float* weight, Q8Out q8, bool norm_otherwise = true) {
    const int D = static_cast<int>(c_.n_embd);
    if (fuse_ && !tp_ && T == 1 && integer_gemv_ && gemv_q8_takes(w.format, w.cols) && w.rows == D) {
      profile_.mark(folded, streamed(T, {w}));
      if (!in_q8.q) in_q8 = quantized(in, T, w.cols);
      GemvParts parts{};
      parts.n = 1, parts.cols = w.cols;
      parts.part[0] = {w.data(), w.format, w.rows, tmp_.get()};
      parts.norm = {arrivals_.get(), x_.get(), delta_norm, weight, D, c_.rms_eps, xn_.get(), q8};
      gemv_q8(parts, in_q8.q, in_q8.scale_sum, T, compute_);
      return true;
    }
    profile_.mark(stretch, streamed(T, {w}));
    matmul({{w, tmp_.get()}}, in, T, in_q8);
    reduce_across_ranks(T);
    if (!norm_otherwise) return false;
    profile_.mark("norms");
    add_rmsnorm(x_.get(), tmp_.get(), delta_norm, weight, D, T, c_.rms_eps, xn_.get(), compute_, q8);
    return true;
  }

  bool run_layers(int T, int n_out, AttentionShape shape, DeviceKvStore& kv, const float* inv_freq,
                  const std::function<bool(std::size_t)>& stop_before) {
    const int D = static_cast<int>(c_.n_embd);
    const float embed_scale = c_.desc->embed_scale ? std::sqrt(static_cast<float>(D)) : 1.0f;
    profile_.mark("embedding");
    embed(token_embd_.view.bytes, token_embd_.view.format, D, meta_, T, embed_scale, x_.get(), compute_);
    bool normed = false;  // the down projection's launch did the next norm (project_and_norm)
    for (std::size_t il = 0; il < c_.n_layer; ++il) {
      if (il > 0 && stop_before) {
        // Paced: queued all at once, a prefill's layers would all be asked about in its first
        // millisecond, long before a newcomer could arrive; here the host waits for layer il - 2,
        // so it asks while the GPU runs layer il - 1, which keeps it busy meanwhile.
        PROMPTLY_CUDA_CHECK(cudaEventRecord(layer_done_[(il - 1) % std::size(layer_done_)], compute_));
        if (il >= 2) PROMPTLY_CUDA_CHECK(cudaEventSynchronize(layer_done_[(il - 2) % std::size(layer_done_)]));
        if (stop_before(il)) return false;
      }
      const DeviceLayer& L = layers_[il];
      // Attention sublayer (the previous FFN output joins the stream first).
      const float* prev_post = il > 0 ? layers_[il - 1].post_ffn_norm.get() : nullptr;
      const Q8Out q8_qkv = q8_for(T, {L.wq, L.wk, L.wv});
      if (!normed) {
        profile_.mark("norms");
        add_rmsnorm(x_.get(), il > 0 ? tmp_.get() : nullptr, prev_post, L.attn_norm.get(), D, T, c_.rms_eps, xn_.get(), compute_, q8_qkv);
      }
      normed = false;
      const bool own_rope = L.local && inv_freq_local_.get();
      const QkvPost post{q_.get(), k_.get(), v_.get(), L.bq.get(), L.bk.get(), L.bv.get(), L.q_norm.get(), L.k_norm.get(),
                         own_rope ? inv_freq_local_.get() : inv_freq, static_cast<int>(c_.n_head), static_cast<int>(c_.n_head_kv),
                         static_cast<int>(c_.head_dim), static_cast<int>(c_.n_rot), c_.rope_neox, c_.rope_attn_factor, c_.rms_eps,
                         static_cast<int>(il)};
      qkv_with_post(L, T, q8_qkv, post, kv);
      AttentionArgs args{q_.get(), attn_.get(), partials_.get(), static_cast<int>(c_.n_head), static_cast<int>(c_.n_head_kv),
                         static_cast<int>(c_.head_dim), static_cast<int>(il), L.local ? static_cast<int>(c_.sliding_window) : 0,
                         1.0f / std::sqrt(static_cast<float>(c_.head_dim)), c_.attn_softcap, shape.chunk, shape.n_splits,
                         fuse_ ? arrivals_.get() : nullptr};
      profile_.mark("attention");
      const Q8Out q8_o = attention_writes_q8(args.head_dim) ? q8_for(T, {L.wo}) : Q8Out{};
      // Decode-sized batches (graphs) keep the split per-token kernel: few queries, long contexts;
      // so do a larger batch's tokens in no tile (pack_step).
      if (tiled_attention(T)) {
        attention_tiles(args, meta_, n_tiles_, kv.desc(), compute_, q8_o, attention_mma_);
        AttentionArgs lone = args;
        lone.tokens = meta_.lone, lone.chunk = lone_shape_.chunk, lone.n_splits = lone_shape_.n_splits;
        if (n_lone_ > 0) attention(lone, meta_, n_lone_, kv.desc(), compute_, q8_o);
      } else {
        attention(args, meta_, T, kv.desc(), compute_, q8_o);
      }
      // The output projection (each rank's heads' share), then the FFN sublayer's norm.
      const bool routed_here = moe_on_device_ && T <= kGemvMaxTokens;
      const Q8Out q8_gate_up = !c_.is_moe() ? q8_for(T, {L.gate, L.up}) : routed_here ? q8_for(T, {L.exp_gate.each[0], L.exp_up.each[0]}) : Q8Out{};
      project_and_norm("attention output matmul", "attention output matmul, norm", L.wo, attn_.get(), T, q8_o, L.post_attn_norm.get(),
                       L.ffn_norm.get(), q8_gate_up);
      if (c_.is_moe()) {
        routed_here ? moe_ffn_on_device(L, T, q8_gate_up) : moe_ffn(L, T);
        reduce_across_ranks(T);  // each rank's expert columns' share
        continue;
      }
      const Q8Out q8_down = gate_up_activation(L, T, q8_gate_up);
      // Each rank's FFN columns' share, then the next layer's norm (or the output norm).
      const bool last = il + 1 == c_.n_layer;
      const Q8Out q8_next = last ? Q8Out{} : q8_for(T, {layers_[il + 1].wq, layers_[il + 1].wk, layers_[il + 1].wv});
      const float* next_weight = last ? output_norm_.get() : layers_[il + 1].attn_norm.get();
      normed = project_and_norm("down matmul", "down matmul, norm", L.down, gate_.get(), T, q8_down, L.post_ffn_norm.get(), next_weight, q8_next,
                                false);
    }
    if (!normed) {
      profile_.mark("norms");
      add_rmsnorm(x_.get(), tmp_.get(), layers_.back().post_ffn_norm.get(), output_norm_.get(), D, T, c_.rms_eps, xn_.get(), compute_);
    }
    profile_.mark("output matmul", streamed(n_out, {output_tied_ ? token_embd_.view : output_.view}));
    gather_rows(xn_.get(), out_rows_, n_out, D, out_x_.get(), compute_);
    if (n_out > 0) matmul({{output_tied_ ? token_embd_.view : output_.view, logits_.get()}}, out_x_.get(), n_out);
    if (c_.final_softcap > 0.0f) softcap(logits_.get(), static_cast<std::size_t>(n_out) * n_logits_, c_.final_softcap, compute_);
    PROMPTLY_CUDA_CHECK(cudaGetLastError());
    return true;
  }

  // The mixture-of-experts FFN, Model::moe_ffn's steps: the router's logits come back to the host,
  // which routes each token as the CPU does (route_experts); each chosen expert then runs once over
  // its tokens (their rows of xn_ gathered; gate/up, activation and down as the dense FFN's), and
  // each token's share joins tmp_ with its weight, expert by expert in index order as on the CPU.
  void moe_ffn(const DeviceLayer& L, int T) {
    const int D = static_cast<int>(c_.n_embd), F = static_cast<int>(c_.n_ff_expert);
    const std::size_t E = c_.n_expert, K = c_.n_expert_used, t_count = static_cast<std::size_t>(T);
    profile_.mark("moe router (routed on the host)");
    matmul({{L.router, router_logits_.get()}}, xn_.get(), T);
    host_router_.reserve(t_count * E * sizeof(float));
    PROMPTLY_CUDA_CHECK(cudaMemcpyAsync(host_router_.as<float>(), router_logits_.get(), t_count * E * sizeof(float), cudaMemcpyDeviceToHost,
                                        compute_));
    // Also the last use of the previous layer's routes (pinned_routes_) has run once this returns.
    PROMPTLY_CUDA_CHECK(cudaStreamSynchronize(compute_));
    choices_.resize(t_count * K);
    for (std::size_t t = 0; t < t_count; ++t) {
      route_experts(host_router_.as<float>() + t * E, c_.n_expert, c_.n_expert_used, c_.desc->router, c_.expert_weights_norm, &choices_[t * K]);
    }
    // Each expert's tokens and weights, expert after expert, up in one copy.
    pinned_routes_.reserve(t_count * K * (sizeof(std::int32_t) + sizeof(float)));
    std::int32_t* rows = pinned_routes_.as<std::int32_t>();
    float* weights = reinterpret_cast<float*>(rows + t_count * K);
    expert_first_.assign(E + 1, 0);
    for (const ExpertChoice& choice : choices_) ++expert_first_[choice.expert + 1];
    for (std::size_t e = 0; e < E; ++e) expert_first_[e + 1] += expert_first_[e];
    std::vector<std::size_t>& next = expert_next_;
    next.assign(expert_first_.begin(), expert_first_.end() - 1);
    for (std::size_t i = 0; i < choices_.size(); ++i) {
      const std::size_t at = next[choices_[i].expert]++;
      rows[at] = static_cast<std::int32_t>(i / K);
      weights[at] = choices_[i].weight;
    }
    PROMPTLY_CUDA_CHECK(cudaMemcpyAsync(expert_routes_.get(), rows, t_count * K * (sizeof(std::int32_t) + sizeof(float)), cudaMemcpyHostToDevice,
                                        compute_));
    const std::int32_t* device_rows = expert_routes_.get();
    const float* device_weights = reinterpret_cast<const float*>(device_rows + t_count * K);
    PROMPTLY_CUDA_CHECK(cudaMemsetAsync(tmp_.get(), 0, t_count * D * sizeof(float), compute_));
    profile_.mark("moe experts");
    for (std::size_t e = 0; e < E; ++e) {
      const int first = static_cast<int>(expert_first_[e]), n = static_cast<int>(expert_first_[e + 1]) - first;
      if (n == 0) continue;
      gather_rows(xn_.get(), device_rows + first, n, D, expert_x_.get(), compute_);
      matmul({{L.exp_gate.each[e], gate_.get()}, {L.exp_up.each[e], up_.get()}}, expert_x_.get(), n);
      const Q8Out q8_down = q8_for(n, {L.exp_down.each[e]});
      gated_activation(gate_.get(), up_.get(), static_cast<std::size_t>(n) * F, gelu(), compute_, q8_down);
      matmul({{L.exp_down.each[e], expert_y_.get()}}, gate_.get(), n, q8_down);
      add_weighted_rows(expert_y_.get(), device_rows + first, device_weights + first, n, D, tmp_.get(), compute_);
    }
  }

  // The same FFN for decode-sized batches without a trip to the host: the router's logits routed
  // on the device (route_experts, as the CPU chooses and weighs), each (token, chosen expert) pair
  // through its expert's gate/up, activation and down (gemv_experts: one launch for gate and up,
  // the activation at its end (GatedTail), one for down, every pair at once), the pairs summed into
  // tmp_ in expert order (moe_combine). Five launches (router, routing, gate/up, down, combine) a
  // layer whatever the batch, and graphs capture them. xn_q8: xn_ as int8, where the norm wrote it.
  void moe_ffn_on_device(const DeviceLayer& L, int T, Q8Out xn_q8) {
    const int D = static_cast<int>(c_.n_embd), F = static_cast<int>(c_.n_ff_expert), K = static_cast<int>(c_.n_expert_used);
    const int pairs = T * K;
    profile_.mark("moe router (routed on the device)", streamed(T, {L.router}));
    matmul({{L.router, router_logits_.get()}}, xn_.get(), T, xn_q8);
    const ExpertRoutes routes{expert_routes_.get(), reinterpret_cast<float*>(expert_routes_.get() + pairs)};
    const bool softmax_over_all = c_.desc->router == arch::Router::SoftmaxThenTopK && !c_.expert_weights_norm;
    route_experts(router_logits_.get(), T, static_cast<int>(c_.n_expert), K, softmax_over_all, routes, compute_);
    profile_.mark("moe experts", pairs * streamed(1, {L.exp_gate.each[0], L.exp_up.each[0], L.exp_down.each[0]}));
    const auto reads_q8 = [](const DeviceExperts& m) { return !is_float_format(m.each.front().format); };
    if ((reads_q8(L.exp_gate) || reads_q8(L.exp_up)) && !xn_q8.q) quantized(xn_.get(), T, D);
    ExpertGemv gate_up{{L.exp_gate.indexed(gate_.get()), L.exp_up.indexed(up_.get())}, 2, F, D, K, {}};
    // The activation at the gate/up launch's end, its int8 into act_q8_ (F: whole blocks, as
    // experts_routable_on_device asks); else a launch of its own after it.
    const bool fused = fuse_ && gemv_experts_gated_takes(gate_up);
    Q8Out q8_down{};
    if (reads_q8(L.exp_down)) q8_down = fused ? Q8Out{act_q8_.get(), act_q8_scales_.get()} : Q8Out{x_q8_.get(), x_q8_scales_.get()};
    if (fused) gate_up.gated = {arrivals_.get(), q8_down, gelu()};
    gemv_experts(gate_up, routes.experts, pairs, xn_.get(), x_q8_.get(), x_q8_scales_.get(), compute_);
    if (!fused) gated_activation(gate_.get(), up_.get(), static_cast<std::size_t>(pairs) * F, gelu(), compute_, q8_down);
    const ExpertGemv down{{L.exp_down.indexed(expert_y_.get()), {}}, 1, D, F, 1, {}};
    gemv_experts(down, routes.experts, pairs, gate_.get(), q8_down.q, q8_down.scale_sum, compute_);
    moe_combine(expert_y_.get(), routes, T, K, D, tmp_.get(), compute_);
  }

  // Whether every layer's experts suit moe_ffn_on_device: each kind at a fixed stride, in a format
  // gemv_experts reads, at most 32 experts a token and 256 in all (route_experts' one warp, 8
  // experts a lane in registers).
  bool experts_routable_on_device() const {
    if (c_.n_expert_used > 32 || c_.n_expert > static_cast<std::uint32_t>(kMaxRoutedExperts)) return false;
    for (const DeviceLayer& L : layers_) {
      for (const DeviceExperts* m : {&L.exp_gate, &L.exp_up, &L.exp_down}) {
        if (m->each.empty() || m->stride == 0 || !gemv_experts_takes(m->each.front().format, m->each.front().cols)) return false;
      }
    }
    return true;
  }

  // Tensor parallelism: tmp_ (T rows of the sublayer's output, this rank's share) summed over the
  // ranks, through pinned host memory and the group's all-reduce (no device-to-device collective
  // here: each rank's GPU may be any device, or the same one).
  void reduce_across_ranks(int T) {
    if (!tp_) return;
    profile_.mark("tensor-parallel sums (through the host)");
    const std::size_t n = static_cast<std::size_t>(T) * c_.n_embd;
    pinned_sums_.reserve(n * sizeof(float));
    PROMPTLY_CUDA_CHECK(cudaMemcpyAsync(pinned_sums_.as<float>(), tmp_.get(), n * sizeof(float), cudaMemcpyDeviceToHost, compute_));
    PROMPTLY_CUDA_CHECK(cudaStreamSynchronize(compute_));
    tp_->all_reduce_sum(pinned_sums_.as<float>(), n);
    PROMPTLY_CUDA_CHECK(cudaMemcpyAsync(tmp_.get(), pinned_sums_.as<float>(), n * sizeof(float), cudaMemcpyHostToDevice, compute_));
  }

  const Model& model_;
  const ModelConfig& c_;  // this rank's share under tensor parallelism
  parallel::Communicator* tp_;
  std::size_t n_logits_;  // a row of logits: the vocabulary, or this rank's part of it
  int device_;
  std::string name_;
  int multiprocessors_ = 0;
  bool use_graphs_ = true;
  bool graphs_past_decode_ = true;  // graphed: until a capture of such a step fails
  bool joined_qkv_ = true;
  bool joined_gate_up_ = true;
  bool integer_gemv_ = true;
  int gemv_batch_ = kGemvBatchDefault;  // the most tokens the integer GEMV takes (see the constructor)
  // Whether T tokens' products with w go through the integer GEMV (else the float GEMV up to
  // kGemvMaxTokens, cuBLAS past it).
  bool integer_gemv_takes(const MatrixView& w, int T) const { return integer_gemv_ && T <= gemv_batch_ && gemv_q8_takes(w.format, w.cols); }
  bool any_integer_gemv(int T, std::initializer_list<MatrixView> matrices) const {
    return std::any_of(matrices.begin(), matrices.end(), [&](const MatrixView& m) { return integer_gemv_takes(m, T); });
  }
  bool layers_integer_ = false;  // every dense layer matrix in a format the integer GEMV takes (a dense model)
  bool fuse_ = true;
  bool attention_tiles_ = true;
  bool attention_mma_ = false;  // the tiles on the tensor cores
  int n_tiles_ = 0, n_lone_ = 0;  // this step's attention tiles and tokens in none (upload_step)
  AttentionShape lone_shape_;     // and how those tokens split their contexts
  bool tiled_attention(int T) const { return attention_tiles_ && T > kGemvMaxTokens; }
  // The gated activation's kind (GeGLU with tanh, else SwiGLU), as every FFN here takes it.
  bool gelu() const { return c_.desc->activation == arch::Activation::GeluTanh; }
  bool moe_on_device_ = false;  // moe_ffn_on_device for decode-sized batches
  bool dependent_launches_ = false;
  StepProfile profile_;
  std::size_t weight_bytes_ = 0;
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  cudaEvent_t uploaded_ = nullptr, sampled_ = nullptr;
  cudaEvent_t layer_done_[3] = {};  // run_layers' pace where it may stop: a ring, the last three layers' ends
  cublasHandle_t cublas_handle_ = nullptr;

  std::vector<DeviceLayer> layers_;
  DeviceMatrix token_embd_, output_;
  bool output_tied_ = false;  // output_ unused: the logits come from token_embd_
  DeviceBuffer<float> output_norm_, inv_freq_, inv_freq_long_, inv_freq_local_;

  DeviceBuffer<std::int32_t> step_;
  StepMeta meta_{};
  const std::int32_t* out_rows_ = nullptr;
  std::vector<std::int32_t> step_host_;
  PinnedBuffer pinned_step_, host_logits_, pinned_draws_, pinned_drawn_;
  DeviceBuffer<DeviceDraw> draws_;
  DeviceBuffer<std::int32_t> drawn_;
  std::vector<char> row_drawn_;  // this pass's logit rows drawn on the device
  std::vector<int> written_;     // blocks_written's
  DeviceBuffer<float> x_, xn_, tmp_, q_, attn_, k_, v_, gate_, up_, out_x_, logits_, partials_;
  DeviceBuffer<__half> x_half_, w_half_;
  // Prefill's products from one GEMM of joined matrices (q/k/v, then gate/up; a token's in one row).
  DeviceBuffer<float> joined_;
  // Mixture of experts (moe_ffn): router logits, each expert's gathered input and output, the
  // routes (rows and weights, expert after expert) on the device and the host.
  DeviceBuffer<float> router_logits_, expert_x_, expert_y_;
  DeviceBuffer<std::int32_t> expert_routes_;
  PinnedBuffer host_router_, pinned_routes_;
  PinnedBuffer pinned_sums_;  // reduce_across_ranks
  std::vector<ExpertChoice> choices_;
  std::vector<std::size_t> expert_first_, expert_next_;
  DeviceBuffer<std::int8_t> x_q8_, act_q8_;  // act_q8_: the gated activation's, written while x_q8_ is read
  DeviceBuffer<float2> x_q8_scales_, act_q8_scales_;
  DeviceBuffer<int> arrivals_;  // the fused launches' counters (kernels.cuh: GatedTail, AttentionArgs)
  std::map<std::tuple<int, int, int, const __half*, const float*>, cudaGraphExec_t> graphs_;
};

}  // namespace

std::unique_ptr<DeviceForward> make_forward(const Model& model, int index) { return std::make_unique<CudaForward>(model, index); }

}  // namespace promptly::backend::cuda
