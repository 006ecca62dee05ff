// --device: where a command's model runs, and `promptly devices`.
#include <cstdio>

#include "backend/device.h"
#include "cli/commands.h"
#include "model/model.h"
#include "util/error.h"

namespace promptly::cli {

backend::DeviceSpec resolve_device(const std::string& flag) {
  const backend::DeviceSpec asked = backend::parse_device(flag);
  if (!asked.is_cuda()) return asked;
  std::string why;
  if (backend::device_usable(asked, why)) return asked;
  // The same command line works on every machine: without the GPU it runs, slower, on the CPU.
  std::fprintf(stderr, "warning: --device %s: %s; running on the CPU\n", backend::to_string(asked).c_str(), why.c_str());
  return {};
}

std::unique_ptr<Model> load_model(std::shared_ptr<const gguf::File> file, std::shared_ptr<parallel::Communicator> tp,
                                  const backend::DeviceSpec& device) {
  if (!device.is_cuda()) return std::make_unique<Model>(std::move(file), std::move(tp));
  ModelLoadOptions load;
  load.keep_file_layout = true;  // the device uploads the file's blocks; CPU repacking would be wasted
  const backend::DeviceSpec mine = tp ? backend::device_of_rank(device, tp->rank()) : device;
  auto model = std::make_unique<Model>(std::move(file), std::move(tp), load);
  backend::place_on_device(*model, mine);
  if (const backend::DeviceForward* on = model->device()) {
    std::fprintf(stderr, "promptly: model on %s, %.0f MB of weights in device memory\n", on->name().c_str(), static_cast<double>(on->weight_bytes()) / 1e6);
  }
  return model;
}

int devices() {
  for (const std::string& line : backend::describe_devices()) std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace promptly::cli
