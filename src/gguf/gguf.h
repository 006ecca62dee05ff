#pragma once
// GGUF v2/v3: metadata key/values, tensor infos and the mmap'd tensor data. Every count, length,
// offset and size is checked against the bytes actually present before it is used, so a truncated
// or hostile file produces an Error naming the file, the field and the problem: never a crash and
// never an allocation that the file's own size does not justify.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tensor/dtype.h"
#include "util/mapped_file.h"

namespace promptly::gguf {

enum class ValueType : std::uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
std::string_view value_type_name(ValueType t);

struct Value;
struct Array {
  ValueType elem_type = ValueType::UINT8;
  std::vector<Value> items;
};

// Integers keep their signedness; all floats widen to double.
struct Value {
  ValueType type = ValueType::UINT8;
  std::variant<std::uint64_t, std::int64_t, double, bool, std::string, Array> data;

  bool is_integer() const;
  bool is_float() const { return type == ValueType::FLOAT32 || type == ValueType::FLOAT64; }
  // Checked conversions: throw Error naming `key` if the value's type or range does not fit.
  std::int64_t as_int(std::string_view key) const;
  double as_double(std::string_view key) const;
  bool as_bool(std::string_view key) const;
  const std::string& as_string(std::string_view key) const;
  const Array& as_array(std::string_view key) const;
  std::string to_display_string(std::size_t max_items = 8) const;
};

struct TensorInfo {
  std::string name;
  std::vector<std::uint64_t> dims;  // ggml order: dims[0] is the contiguous (row) dimension
  DType type = DType::F32;
  std::uint64_t offset = 0;         // from the start of the data section
  std::uint64_t n_elements = 0;
  std::uint64_t n_bytes = 0;
  const std::uint8_t* data = nullptr;  // into the mapped file

  std::uint64_t rows() const { return dims.empty() ? 1 : n_elements / dims[0]; }
  std::string shape_string() const;
};

class File {
 public:
  // Maps and validates `path`; throws Error on any problem.
  static std::shared_ptr<File> open(const std::string& path);
  // Parses an in-memory image (used by the fuzzer and tests); `data` must outlive the File.
  static std::unique_ptr<File> parse(const std::uint8_t* data, std::size_t size, const std::string& name);

  const std::string& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  std::uint32_t alignment() const { return alignment_; }
  std::uint64_t file_size() const { return size_; }
  std::uint64_t data_offset() const { return data_offset_; }

  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed lookups with defaults; a present key of the wrong type is an Error, not a default.
  std::optional<std::int64_t> get_int(std::string_view key) const;
  std::optional<double> get_double(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  const Array* get_array(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // See MappedFile::release; a no-op for files parsed from memory.
  void release_pages(const std::uint8_t* p, std::size_t n) const {
    if (mapping_) mapping_->release(p, n);
  }
  const TensorInfo* find_tensor(std::string_view name) const;

 private:
  File() = default;
  void parse_all(const std::uint8_t* data, std::size_t size);

  std::shared_ptr<MappedFile> mapping_;
  std::string path_;
  std::uint64_t size_ = 0;
  std::uint32_t version_ = 0;
  std::uint32_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, std::size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;
};

}  // namespace promptly::gguf
