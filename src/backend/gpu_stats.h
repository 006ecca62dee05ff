#pragma once
// A GPU's utilisation and memory, as nvidia-smi shows them, for serve's /metrics. Read through NVML
// (the driver's management library), opened at run time: the binary neither links nor needs it, and
// a machine without an NVIDIA driver just has no GPU statistics.
#include <cstdint>
#include <optional>
#include <string>

namespace promptly::backend {

struct GpuStats {
  double utilization_perc = 0;  // of the last sample period (1/6 s to 1 s, by product), 0 to 100
  std::uint64_t memory_used_bytes = 0;
  std::uint64_t memory_total_bytes = 0;
};

// Statistics of the GPU at a PCI bus id ("0000:3b:00.0", as DeviceForward::pci_bus_id gives it):
// the id names the same card to CUDA and NVML whatever CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER
// say. Thread-safe; NVML is loaded and initialised on the first call only. nullopt, with `why` set
// when given, when there is no NVML, it fails to initialise, or there is no such device.
std::optional<GpuStats> read_gpu_stats(const std::string& pci_bus_id, std::string* why = nullptr);

}  // namespace promptly::backend
