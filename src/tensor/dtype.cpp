#include "tensor/dtype.h"

#include <array>

#include "util/error.h"

namespace promptly {
namespace {

struct Entry {
  std::uint32_t id;
  DTypeInfo info;
};

constexpr std::array kTable = {
    Entry{0, {"F32", 1, 4, true}},        Entry{1, {"F16", 1, 2, true}},
    Entry{2, {"Q4_0", 32, 18, true}},     Entry{3, {"Q4_1", 32, 20, false}},
    Entry{6, {"Q5_0", 32, 22, true}},    Entry{7, {"Q5_1", 32, 24, false}},
    Entry{8, {"Q8_0", 32, 34, true}},     Entry{9, {"Q8_1", 32, 36, false}},
    Entry{10, {"Q2_K", 256, 84, false}},  Entry{11, {"Q3_K", 256, 110, true}},
    Entry{12, {"Q4_K", 256, 144, true}},  Entry{13, {"Q5_K", 256, 176, true}},
    Entry{14, {"Q6_K", 256, 210, true}},  Entry{15, {"Q8_K", 256, 292, false}},
    Entry{16, {"IQ2_XXS", 256, 66, false}}, Entry{17, {"IQ2_XS", 256, 74, false}},
    Entry{18, {"IQ3_XXS", 256, 98, false}}, Entry{19, {"IQ1_S", 256, 50, false}},
    Entry{20, {"IQ4_NL", 32, 18, true}}, Entry{21, {"IQ3_S", 256, 110, false}},
    Entry{22, {"IQ2_S", 256, 82, false}}, Entry{23, {"IQ4_XS", 256, 136, true}},
    Entry{24, {"I8", 1, 1, false}},       Entry{25, {"I16", 1, 2, false}},
    Entry{26, {"I32", 1, 4, false}},      Entry{27, {"I64", 1, 8, false}},
    Entry{28, {"F64", 1, 8, false}},      Entry{29, {"IQ1_M", 256, 56, false}},
    Entry{30, {"BF16", 1, 2, true}},      Entry{34, {"TQ1_0", 256, 54, false}},
    Entry{35, {"TQ2_0", 256, 66, false}}, Entry{39, {"MXFP4", 32, 17, false}},
};

}  // namespace

std::optional<DTypeInfo> dtype_info(std::uint32_t id) {
  for (const Entry& e : kTable) {
    if (e.id == id) return e.info;
  }
  return std::nullopt;
}

const DTypeInfo& dtype_info(DType t) {
  for (const Entry& e : kTable) {
    if (e.id == static_cast<std::uint32_t>(t)) return e.info;
  }
  throw Error("internal: unknown dtype id " + std::to_string(static_cast<std::uint32_t>(t)));
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const Entry& e : kTable) {
    if (e.info.name == name) return static_cast<DType>(e.id);
  }
  return std::nullopt;
}

std::string supported_dtype_list() {
  return "F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS";
}

}  // namespace promptly
