#include "model/fingerprint.h"

#include <algorithm>
#include <variant>

#include "util/hash.h"

namespace promptly {

namespace {

std::uint64_t hash_value(std::uint64_t h, const gguf::Value& v) {
  h = hash_combine(h, static_cast<std::uint64_t>(v.type));
  return std::visit(
      [&](const auto& x) -> std::uint64_t {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return hash_combine(h, hash_string(x));
        } else if constexpr (std::is_same_v<T, gguf::Array>) {
          std::uint64_t a = hash_combine(h, x.items.size());
          for (const gguf::Value& item : x.items) a = hash_value(a, item);
          return a;
        } else if constexpr (std::is_same_v<T, double>) {
          return hash_combine(h, hash_bytes(&x, sizeof x));
        } else {
          return hash_combine(h, static_cast<std::uint64_t>(x));
        }
      },
      v.data);
}

}  // namespace

std::uint64_t model_fingerprint(const gguf::File& file) {
  constexpr std::size_t kSample = 256;
  std::uint64_t h = hash_combine(0x70726f6d70746c79ULL, file.version());
  for (const auto& [key, value] : file.metadata()) h = hash_value(hash_combine(h, hash_string(key)), value);
  for (const gguf::TensorInfo& t : file.tensors()) {
    h = hash_combine(h, hash_string(t.name));
    h = hash_combine(h, static_cast<std::uint64_t>(t.type));
    for (std::uint64_t d : t.dims) h = hash_combine(h, d);
    h = hash_combine(h, t.offset);
    if (t.data && t.n_bytes > 0) {
      const std::size_t n = std::min<std::size_t>(kSample, t.n_bytes);
      h = hash_combine(h, hash_bytes(t.data, n));
      h = hash_combine(h, hash_bytes(t.data + t.n_bytes - n, n));
    }
  }
  return h;
}

}  // namespace promptly
