#include "convert/file_type.h"

namespace promptly {

std::uint32_t file_type_for(DType dominant) {
  switch (dominant) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q4_0: return 2;
    case DType::Q8_0: return 7;
    case DType::Q4_K: return 14;  // Q4_K_S: every matrix Q4_K
    case DType::Q6_K: return 18;
    case DType::BF16: return 32;
    default: return 0;
  }
}

}  // namespace promptly
