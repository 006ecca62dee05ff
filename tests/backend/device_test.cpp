// The device seam's parts that need no GPU: --device parsing, whether a device is usable, and GPU
// statistics where there is no NVIDIA driver. On a machine with a GPU the absent-GPU cases skip.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include "backend/device.h"
#include "backend/gpu_stats.h"
#include "util/error.h"

namespace promptly::backend {
namespace {

using Kind = DeviceSpec::Kind;

TEST(Device, ParsesCpuCudaAndCudaN) {
  EXPECT_EQ(parse_device("cpu").kind, Kind::Cpu);
  const DeviceSpec cuda = parse_device("cuda");
  EXPECT_EQ(cuda.kind, Kind::Cuda);
  EXPECT_EQ(cuda.index, 0);
  const DeviceSpec third = parse_device("cuda:3");
  EXPECT_EQ(third.kind, Kind::Cuda);
  EXPECT_EQ(third.index, 3);
  EXPECT_EQ(to_string(third), "cuda:3");
  const DeviceSpec gpu = parse_device("gpu");  // an alias of cuda:0
  EXPECT_TRUE(gpu.is_cuda());
  EXPECT_EQ(gpu.index, 0);
  EXPECT_EQ(to_string(parse_device("cpu")), "cpu");
}

TEST(Device, RejectsOtherTextNamingWhatIsAccepted) {
  for (const char* bad : {"cuda:", "cuda:-1", "cuda:x", "cuda:1x", "tpu", ""}) {
    try {
      parse_device(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("'" + std::string(bad) + "'"), std::string::npos) << message;
      EXPECT_NE(message.find("cpu, cuda or cuda:N"), std::string::npos) << message;
    }
  }
}

TEST(Device, CpuIsAlwaysUsable) {
  std::string why;
  EXPECT_TRUE(device_usable(parse_device("cpu"), why));
  EXPECT_TRUE(why.empty()) << why;
}

TEST(Device, CudaWithoutAGpuIsUnusableAndSaysWhy) {
  std::string why;
  if (device_usable(parse_device("cuda"), why)) GTEST_SKIP() << "this machine has a usable GPU";
  EXPECT_FALSE(why.empty());
  // The listing says the same in its own words: one line, no devices.
  const std::vector<std::string> lines = describe_devices();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("no CUDA devices"), std::string::npos) << lines[0];
}

bool nvml_present() {
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (nvml) dlclose(nvml);
  return nvml != nullptr;
}

TEST(GpuStats, WithoutNvmlThereAreNoneAndAReason) {
  if (nvml_present()) GTEST_SKIP() << "NVML is installed here";
  std::string why;
  EXPECT_FALSE(read_gpu_stats("0000:3b:00.0", &why));
  EXPECT_NE(why.find("NVML is not available"), std::string::npos) << why;
  EXPECT_FALSE(read_gpu_stats("0000:3b:00.0"));  // and asking again, without a reason, is the same answer
}
// With a GPU: CudaModel.ReportsItsDeviceAndMeasuresItsBandwidth (cuda_test.cpp) reads the model's
// card by its bus id and checks the figures' ranges.

}  // namespace
}  // namespace promptly::backend
