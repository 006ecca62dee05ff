#include "backend/device.h"

#include <charconv>

#include "model/model.h"
#include "util/error.h"
#ifdef PROMPTLY_HAVE_CUDA
#include "backend/cuda/cuda_forward.h"
#include "backend/cuda/runtime.h"
#endif

namespace promptly::backend {

DeviceSpec parse_device(std::string_view text) {
  const auto bad = [&] { return Error("--device '" + std::string(text) + "' is not a device: cpu, cuda or cuda:N (N = 0, 1, ...)"); };
  if (text == "cpu") return {};
  if (text == "cuda" || text == "gpu") return {DeviceSpec::Kind::Cuda, 0};
  constexpr std::string_view prefix = "cuda:";
  if (!text.starts_with(prefix)) throw bad();
  const std::string_view digits = text.substr(prefix.size());
  int index = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || index < 0) throw bad();
  return {DeviceSpec::Kind::Cuda, index};
}

std::string to_string(const DeviceSpec& spec) { return spec.is_cuda() ? "cuda:" + std::to_string(spec.index) : "cpu"; }

bool device_usable(const DeviceSpec& spec, std::string& why) {
  if (!spec.is_cuda()) return true;
#ifdef PROMPTLY_HAVE_CUDA
  std::string error;
  const int n = cuda::device_count(error);
  if (n <= 0) {
    why = "no CUDA device is usable here (" + (error.empty() ? std::string("none found") : error) + ")";
    return false;
  }
  if (spec.index >= n) {
    why = to_string(spec) + " does not exist: this machine has " + std::to_string(n) + " CUDA device" + (n == 1 ? "" : "s") +
          " (cuda:0" + (n > 1 ? " to cuda:" + std::to_string(n - 1) : std::string()) + ")";
    return false;
  }
  return true;
#else
  why = "this promptly was built without CUDA (configure with the CUDA toolkit installed, or -DPROMPTLY_CUDA=ON)";
  return false;
#endif
}

DeviceSpec device_of_rank(const DeviceSpec& spec, int rank) {
  if (!spec.is_cuda()) return spec;
#ifdef PROMPTLY_HAVE_CUDA
  std::string error;
  const int n = cuda::device_count(error);
  if (n > 0) return {DeviceSpec::Kind::Cuda, (spec.index + rank) % n};
#endif
  (void)rank;
  return spec;
}

std::vector<std::string> describe_devices() {
#ifdef PROMPTLY_HAVE_CUDA
  return cuda::describe_devices();
#else
  return {"no CUDA devices: this promptly was built without CUDA"};
#endif
}

void place_on_device([[maybe_unused]] Model& model, const DeviceSpec& spec) {  // unused without CUDA
  if (!spec.is_cuda()) return;
  std::string why;
  if (!device_usable(spec, why)) throw Error("--device " + to_string(spec) + ": " + why);
#ifdef PROMPTLY_HAVE_CUDA
  model.attach_device(cuda::make_forward(model, spec.index));
#endif
}

}  // namespace promptly::backend
