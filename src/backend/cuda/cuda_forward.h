#pragma once
// The forward pass on an NVIDIA GPU (see cuda_forward.cpp).
#include <memory>

#include "backend/device.h"

namespace promptly::backend::cuda {

// Uploads the model's weights (as the file stores them) to device `index` and returns the pass
// that runs there. Throws Error for what the GPU path does not run (heads over 256 elements, weight
// formats its kernels do not read), naming it.
std::unique_ptr<DeviceForward> make_forward(const Model& model, int index);

}  // namespace promptly::backend::cuda
