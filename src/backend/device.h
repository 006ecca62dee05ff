#pragma once
// The device seam: where a model's forward pass runs. The CPU path is Model's own (kernels/);
// `--device cuda[:N]` moves weights, KV blocks and activations to an NVIDIA GPU (backend/cuda/)
// when the binary was built with CUDA and the machine has one. Everything above the forward pass
// (scheduler, prefix tree, sampling, server) is the same code on either.
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/device_draw.h"
#include "kv/block_pool.h"

namespace promptly {
class KvCache;
class Model;
struct Batch;
}  // namespace promptly

namespace promptly::backend {

// What a device's KV blocks hold, whatever --kv-type asks of the CPU's.
inline constexpr KvType kDeviceKvType = KvType::F16;

struct DeviceSpec {
  enum class Kind { Cpu, Cuda };
  Kind kind = Kind::Cpu;
  int index = 0;  // cuda:N
  bool is_cuda() const { return kind == Kind::Cuda; }
};

// "cpu", "cuda" (device 0) or "cuda:N"; throws Error naming what is accepted otherwise.
DeviceSpec parse_device(std::string_view text);
std::string to_string(const DeviceSpec& spec);

// Whether this binary can run on `spec` here; when not, `why` says what is missing in words a user
// can act on (built without CUDA, no driver, no such device).
bool device_usable(const DeviceSpec& spec, std::string& why);

// One line per CUDA device this process sees ("cuda:0 NVIDIA H200, 139.8 GiB, compute 9.0"), or
// one line saying why there are none.
std::vector<std::string> describe_devices();

// A model's forward pass on a device. Model::forward hands its batches here once one is attached
// (see place_on_device); the KvCache keeps its block tables and lengths on the host as always, and
// the device keeps the blocks' contents (KvCache::device_state).
class DeviceForward {
 public:
  virtual ~DeviceForward() = default;
  // Model::forward's contract, on the device, `sampling` included; Model::forward has checked the
  // batch and reserved its tokens' KV slots.
  virtual bool forward(const Batch& batch, KvCache& cache, std::vector<float>& logits,
                       const std::function<bool(std::size_t layer)>& stop_before, DeviceSampling* sampling) = 0;
  virtual std::string name() const = 0;  // "cuda:0 (NVIDIA H200)"
  // Where the passes' time went, when the device was asked to profile them (the CUDA pass:
  // PROMPTLY_CUDA_PROFILE=1); empty otherwise.
  virtual std::string profile_report() const { return {}; }
  // The device's PCI bus id ("0000:3b:00.0"): how NVML (backend/gpu_stats.h) finds the same card.
  virtual std::string pci_bus_id() const = 0;
  // Bytes of device memory the weights take.
  virtual std::size_t weight_bytes() const = 0;
  // The device memory's bandwidth, measured now: a large device-to-device copy's bytes read and
  // written over its time, in GB/s (what a decode step's weight stream is held against).
  virtual double measure_bandwidth_gbs() = 0;
  // Device memory free now (after the weights): what a KV budget may take, less room for a pass's
  // activations.
  virtual std::size_t free_memory_bytes() const = 0;
  // Bytes one KV block of `block_tokens` positions takes on the device (every layer, keys and
  // values, as kDeviceKvType, stored head by head: a host pool's block of that type).
  virtual std::size_t kv_block_bytes(std::size_t block_tokens) const = 0;
  // Gives `cache` its device state (KvCache::DeviceState: the blocks' contents on the device) now
  // rather than at its first pass, so that the KV spool can read blocks into it before any pass.
  // The cache's pool must be of kDeviceKvType with rows stored head by head and every layer together.
  virtual void attach_kv(KvCache& cache) = 0;
};

// Attaches a device forward pass to `model` (loaded with ModelLoadOptions::keep_file_layout). Throws
// Error when the model has a part the device does not run yet (named), or the device cannot be used.
void place_on_device(Model& model, const DeviceSpec& spec);
// Tensor parallelism on GPUs (--device cuda:N --tp R): rank r's device, cuda:(N + r) modulo the
// machine's devices (one GPU each where there are R; ranks share a GPU where there are fewer).
DeviceSpec device_of_rank(const DeviceSpec& spec, int rank);

}  // namespace promptly::backend
