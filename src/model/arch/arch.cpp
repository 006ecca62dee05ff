#include "model/arch/arch.h"

#include <algorithm>

namespace promptly::arch {
namespace {

const std::vector<Arch>& registry() {
  static const std::vector<Arch> all = [] {
    std::vector<Arch> v = {gemma2(), gemma3(), llama(), phi3(), qwen2(), qwen3(), qwen3moe()};
    std::sort(v.begin(), v.end(), [](const Arch& a, const Arch& b) { return a.name < b.name; });
    return v;
  }();
  return all;
}

}  // namespace

const Arch* find(std::string_view name) {
  for (const Arch& a : registry()) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

std::string supported_list() {
  std::string s;
  for (const Arch& a : registry()) s += (s.empty() ? "" : ", ") + a.name;
  return s;
}

}  // namespace promptly::arch
