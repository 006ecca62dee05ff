#include "backend/gpu_stats.h"

#include <dlfcn.h>

namespace promptly::backend {
namespace {

// The few parts of NVML's C API used here, declared by hand: there is no nvml.h to build against,
// and NVML keeps these stable (its documented ABI; NVML API Reference, "Initialization and
// Cleanup", "Device Queries"):
//   nvmlReturn_t nvmlInit_v2(void);
//   nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* pciBusId, nvmlDevice_t* device);
//   nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* utilization);
//   nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory);
//   const char* nvmlErrorString(nvmlReturn_t result);
// nvmlReturn_t is a C enum (int), NVML_SUCCESS = 0; nvmlDevice_t an opaque pointer.
using NvmlReturn = int;
constexpr NvmlReturn kNvmlSuccess = 0;
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlUtilization {  // nvmlUtilization_t: percent of the last sample period
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlMemory {  // nvmlMemory_t (v1): bytes
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

// NVML, opened and initialised once for the process. It is never shut down or closed: /metrics may
// ask until the process exits, and NVML's calls are thread-safe once initialised.
class Nvml {
 public:
  static const Nvml& get() {
    static const Nvml nvml;  // C++ guarantees a thread-safe one-time initialisation
    return nvml;
  }

  std::optional<GpuStats> read(const std::string& pci_bus_id, std::string& why) const {
    if (!error_.empty()) {
      why = error_;
      return std::nullopt;
    }
    const std::string name = "GPU at " + pci_bus_id;
    NvmlDevice device = nullptr;
    if (NvmlReturn r = get_handle_by_bus_(pci_bus_id.c_str(), &device); r != kNvmlSuccess) {
      why = "NVML has no " + name + ": " + error_string(r);
      return std::nullopt;
    }
    NvmlUtilization utilization{};
    if (NvmlReturn r = get_utilization_(device, &utilization); r != kNvmlSuccess) {
      why = "NVML cannot read the " + name + "'s utilisation: " + error_string(r);
      return std::nullopt;
    }
    NvmlMemory memory{};
    if (NvmlReturn r = get_memory_(device, &memory); r != kNvmlSuccess) {
      why = "NVML cannot read the " + name + "'s memory: " + error_string(r);
      return std::nullopt;
    }
    return GpuStats{static_cast<double>(utilization.gpu), memory.used, memory.total};
  }

 private:
  Nvml() {
    // The versioned name: the unversioned libnvidia-ml.so comes only with the driver's development
    // package, libnvidia-ml.so.1 with the driver itself.
    library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!library_) {
      const char* e = dlerror();
      error_ = "NVML is not available (no NVIDIA driver here?): " + std::string(e ? e : "libnvidia-ml.so.1 not found");
      return;
    }
    const auto init = symbol<NvmlReturn (*)()>("nvmlInit_v2");
    get_handle_by_bus_ = symbol<NvmlReturn (*)(const char*, NvmlDevice*)>("nvmlDeviceGetHandleByPciBusId_v2");
    get_utilization_ = symbol<NvmlReturn (*)(NvmlDevice, NvmlUtilization*)>("nvmlDeviceGetUtilizationRates");
    get_memory_ = symbol<NvmlReturn (*)(NvmlDevice, NvmlMemory*)>("nvmlDeviceGetMemoryInfo");
    error_string_ = symbol<const char* (*)(NvmlReturn)>("nvmlErrorString");
    if (!error_.empty()) return;
    if (NvmlReturn r = init(); r != kNvmlSuccess) error_ = "NVML failed to initialise: " + error_string(r);
  }

  // A function of the library; a missing one leaves the first such error in error_.
  template <typename Fn>
  Fn symbol(const char* name) {
    void* p = library_ ? dlsym(library_, name) : nullptr;
    if (!p && error_.empty()) error_ = std::string("NVML (libnvidia-ml.so.1) lacks ") + name + ": too old a driver?";
    return reinterpret_cast<Fn>(p);
  }

  std::string error_string(NvmlReturn r) const {
    const char* s = error_string_ ? error_string_(r) : nullptr;
    return s ? std::string(s) : "NVML error " + std::to_string(r);
  }

  void* library_ = nullptr;
  std::string error_;  // set: NVML is unusable, and this says why
  NvmlReturn (*get_handle_by_bus_)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*get_utilization_)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*get_memory_)(NvmlDevice, NvmlMemory*) = nullptr;
  const char* (*error_string_)(NvmlReturn) = nullptr;
};

}  // namespace

std::optional<GpuStats> read_gpu_stats(const std::string& pci_bus_id, std::string* why) {
  std::string reason;
  std::optional<GpuStats> stats = Nvml::get().read(pci_bus_id, reason);
  if (!stats && why) *why = reason;
  return stats;
}

}  // namespace promptly::backend
