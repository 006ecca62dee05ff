#pragma once
// Writes GGUF v3. Tensor data is produced one tensor at a time by a callback, so multi-gigabyte
// models (gen-model, quantize) are streamed to disk without holding them in memory.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace promptly::gguf {

class Writer {
 public:
  // Fills `out` (already sized to the tensor's byte size) with the tensor's data.
  using Producer = std::function<void(std::uint8_t* out)>;

  // "general.alignment" is not stored as a key but sets the data alignment (written when not 32).
  void set(const std::string& key, Value value);
  void set_u32(const std::string& key, std::uint32_t v);
  void set_i32(const std::string& key, std::int32_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_string_array(const std::string& key, const std::vector<std::string>& v);
  void set_f32_array(const std::string& key, const std::vector<float>& v);
  void set_i32_array(const std::string& key, const std::vector<std::int32_t>& v);

  void add_tensor(const std::string& name, std::vector<std::uint64_t> dims, DType type, Producer producer);

  void set_alignment(std::uint32_t alignment) { alignment_ = alignment; }

  // Writes the whole file; throws Error on I/O failure (the partial file is removed).
  void write(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    std::vector<std::uint64_t> dims;
    DType type;
    std::uint64_t n_bytes;
    Producer producer;
  };
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<PendingTensor> tensors_;
  std::uint32_t alignment_ = 32;
};

}  // namespace promptly::gguf
