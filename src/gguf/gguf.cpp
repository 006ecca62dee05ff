#include "gguf/gguf.h"

#include <cstring>
#include <limits>
#include <sstream>

#include "util/error.h"

namespace promptly::gguf {
namespace {

constexpr std::uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxArrayDepth = 8;
constexpr std::uint32_t kMaxDims = 4;
// Real vocabularies have a few hundred thousand entries; the cap keeps a hostile array from
// costing more than about a gigabyte of parsed values.
constexpr std::uint64_t kMaxArrayItems = std::uint64_t{1} << 24;

// Minimal encoded size of one value of `t`, used to reject counts that cannot fit in the bytes left
// before anything is allocated for them.
std::uint64_t min_encoded_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    case ValueType::STRING: return 8;
    case ValueType::ARRAY: return 12;
  }
  return 1;
}

bool valid_value_type(std::uint32_t t) { return t <= 12; }

class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size, const std::string& file)
      : data_(data), size_(size), file_(file) {}

  std::uint64_t pos() const { return pos_; }
  std::uint64_t remaining() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error("invalid GGUF file '" + file_ + "': " + field + ": " + what + " (at byte offset " +
                std::to_string(pos_) + " of " + std::to_string(size_) + ")");
  }

  template <typename T>
  T read(const std::string& field) {
    if (remaining() < sizeof(T)) fail(field, "file is truncated (need " + std::to_string(sizeof(T)) + " bytes)");
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const std::string& field) {
    const auto len = read<std::uint64_t>(field + " (string length)");
    if (len > remaining()) {
      fail(field, "string length " + std::to_string(len) + " exceeds the " + std::to_string(remaining()) +
                      " bytes left in the file");
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<std::size_t>(len));
    pos_ += len;
    return s;
  }

  Value read_value(ValueType type, const std::string& field, int depth) {
    Value v;
    v.type = type;
    switch (type) {
      case ValueType::UINT8: v.data = std::uint64_t{read<std::uint8_t>(field)}; break;
      case ValueType::INT8: v.data = std::int64_t{read<std::int8_t>(field)}; break;
      case ValueType::UINT16: v.data = std::uint64_t{read<std::uint16_t>(field)}; break;
      case ValueType::INT16: v.data = std::int64_t{read<std::int16_t>(field)}; break;
      case ValueType::UINT32: v.data = std::uint64_t{read<std::uint32_t>(field)}; break;
      case ValueType::INT32: v.data = std::int64_t{read<std::int32_t>(field)}; break;
      case ValueType::UINT64: v.data = std::uint64_t{read<std::uint64_t>(field)}; break;
      case ValueType::INT64: v.data = std::int64_t{read<std::int64_t>(field)}; break;
      case ValueType::FLOAT32: v.data = double{read<float>(field)}; break;
      case ValueType::FLOAT64: v.data = read<double>(field); break;
      case ValueType::BOOL: {
        const auto b = read<std::uint8_t>(field);
        if (b > 1) fail(field, "bool value is " + std::to_string(b) + ", expected 0 or 1");
        v.data = b != 0;
        break;
      }
      case ValueType::STRING: v.data = read_string(field); break;
      case ValueType::ARRAY: {
        if (depth >= kMaxArrayDepth) fail(field, "arrays nested deeper than " + std::to_string(kMaxArrayDepth));
        const auto et = read<std::uint32_t>(field + " (array element type)");
        if (!valid_value_type(et)) fail(field, "unknown array element type " + std::to_string(et));
        const auto n = read<std::uint64_t>(field + " (array length)");
        const ValueType elem = static_cast<ValueType>(et);
        if (n > remaining() / min_encoded_size(elem)) {
          fail(field, "array length " + std::to_string(n) + " cannot fit in the " + std::to_string(remaining()) +
                          " bytes left in the file");
        }
        if (n > kMaxArrayItems) {
          fail(field, "array length " + std::to_string(n) + " exceeds the limit of " + std::to_string(kMaxArrayItems));
        }
        Array arr;
        arr.elem_type = elem;
        arr.items.reserve(static_cast<std::size_t>(n));
        for (std::uint64_t i = 0; i < n; ++i) {
          arr.items.push_back(read_value(elem, field + "[" + std::to_string(i) + "]", depth + 1));
        }
        v.data = std::move(arr);
        break;
      }
    }
    return v;
  }

 private:
  const std::uint8_t* data_;
  std::uint64_t size_;
  std::uint64_t pos_ = 0;
  const std::string& file_;
};

}  // namespace

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8: return "uint8";
    case ValueType::INT8: return "int8";
    case ValueType::UINT16: return "uint16";
    case ValueType::INT16: return "int16";
    case ValueType::UINT32: return "uint32";
    case ValueType::INT32: return "int32";
    case ValueType::FLOAT32: return "float32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::UINT64: return "uint64";
    case ValueType::INT64: return "int64";
    case ValueType::FLOAT64: return "float64";
  }
  return "?";
}

bool Value::is_integer() const {
  return std::holds_alternative<std::uint64_t>(data) || std::holds_alternative<std::int64_t>(data);
}

std::int64_t Value::as_int(std::string_view key) const {
  if (const auto* u = std::get_if<std::uint64_t>(&data)) {
    if (*u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      throw Error("metadata key '" + std::string(key) + "': value " + std::to_string(*u) + " is out of range");
    }
    return static_cast<std::int64_t>(*u);
  }
  if (const auto* i = std::get_if<std::int64_t>(&data)) return *i;
  throw Error("metadata key '" + std::string(key) + "' has type " + std::string(value_type_name(type)) +
              ", expected an integer");
}

double Value::as_double(std::string_view key) const {
  if (const auto* d = std::get_if<double>(&data)) return *d;
  if (is_integer()) return static_cast<double>(as_int(key));
  throw Error("metadata key '" + std::string(key) + "' has type " + std::string(value_type_name(type)) +
              ", expected a number");
}

bool Value::as_bool(std::string_view key) const {
  if (const auto* b = std::get_if<bool>(&data)) return *b;
  throw Error("metadata key '" + std::string(key) + "' has type " + std::string(value_type_name(type)) +
              ", expected bool");
}

const std::string& Value::as_string(std::string_view key) const {
  if (const auto* s = std::get_if<std::string>(&data)) return *s;
  throw Error("metadata key '" + std::string(key) + "' has type " + std::string(value_type_name(type)) +
              ", expected string");
}

const Array& Value::as_array(std::string_view key) const {
  if (const auto* a = std::get_if<Array>(&data)) return *a;
  throw Error("metadata key '" + std::string(key) + "' has type " + std::string(value_type_name(type)) +
              ", expected array");
}

std::string Value::to_display_string(std::size_t max_items) const {
  std::ostringstream os;
  if (const auto* u = std::get_if<std::uint64_t>(&data)) {
    os << *u;
  } else if (const auto* i = std::get_if<std::int64_t>(&data)) {
    os << *i;
  } else if (const auto* d = std::get_if<double>(&data)) {
    os << *d;
  } else if (const auto* b = std::get_if<bool>(&data)) {
    os << (*b ? "true" : "false");
  } else if (const auto* s = std::get_if<std::string>(&data)) {
    std::string shown = s->size() > 60 ? s->substr(0, 60) + "..." : *s;
    for (char& c : shown) if (c == '\n') c = ' ';
    os << '"' << shown << '"';
  } else if (const auto* a = std::get_if<Array>(&data)) {
    os << value_type_name(a->elem_type) << "[" << a->items.size() << "] [";
    for (std::size_t k = 0; k < a->items.size() && k < max_items; ++k) {
      os << (k ? ", " : "") << a->items[k].to_display_string(max_items);
    }
    if (a->items.size() > max_items) os << ", ...";
    os << "]";
  }
  return os.str();
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

std::shared_ptr<File> File::open(const std::string& path) {
  auto mapping = std::make_shared<MappedFile>(path);
  std::unique_ptr<File> f(new File());
  f->mapping_ = mapping;
  f->path_ = path;
  f->parse_all(mapping->data(), mapping->size());
  return f;
}

std::unique_ptr<File> File::parse(const std::uint8_t* data, std::size_t size, const std::string& name) {
  std::unique_ptr<File> f(new File());
  f->path_ = name;
  f->parse_all(data, size);
  return f;
}

void File::parse_all(const std::uint8_t* data, std::size_t size) {
  size_ = size;
  Reader r(data, size, path_);
  const auto magic = r.read<std::uint32_t>("magic");
  if (magic != kMagic) r.fail("magic", "not a GGUF file (the first 4 bytes are not 'GGUF')");
  version_ = r.read<std::uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    r.fail("version", "GGUF version " + std::to_string(version_) + " is not supported (supported: 2, 3)");
  }
  const auto n_tensors = r.read<std::uint64_t>("tensor_count");
  const auto n_kv = r.read<std::uint64_t>("metadata_kv_count");
  // A key/value needs at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least 8 + 4 + 4 + 8.
  if (n_kv > r.remaining() / 13) r.fail("metadata_kv_count", std::to_string(n_kv) + " is impossible for the file size");
  if (n_tensors > r.remaining() / 24) r.fail("tensor_count", std::to_string(n_tensors) + " is impossible for the file size");

  kv_.reserve(static_cast<std::size_t>(n_kv));
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    const std::string field = "metadata[" + std::to_string(i) + "]";
    std::string key = r.read_string(field + ".key");
    const auto type = r.read<std::uint32_t>("metadata '" + key + "' type");
    if (!valid_value_type(type)) r.fail("metadata '" + key + "'", "unknown value type " + std::to_string(type));
    Value v = r.read_value(static_cast<ValueType>(type), "metadata '" + key + "'", 0);
    if (kv_index_.count(key)) r.fail("metadata '" + key + "'", "duplicate key");
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const Value* a = find("general.alignment")) {
    if (!a->is_integer()) r.fail("general.alignment", "must be an integer");
    const std::int64_t al = a->as_int("general.alignment");
    if (al <= 0 || al > (1 << 20) || (al & (al - 1)) != 0) {
      r.fail("general.alignment", "value " + std::to_string(al) + " is not a power of two in [1, 2^20]");
    }
    alignment_ = static_cast<std::uint32_t>(al);
  }

  tensors_.reserve(static_cast<std::size_t>(n_tensors));
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    t.name = r.read_string("tensor[" + std::to_string(i) + "].name");
    const std::string field = "tensor '" + t.name + "'";
    const auto n_dims = r.read<std::uint32_t>(field + " n_dims");
    if (n_dims == 0 || n_dims > kMaxDims) {
      r.fail(field, "n_dims is " + std::to_string(n_dims) + ", expected 1.." + std::to_string(kMaxDims));
    }
    t.n_elements = 1;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const auto dim = r.read<std::uint64_t>(field + " dim " + std::to_string(d));
      if (dim == 0 || dim > (std::uint64_t{1} << 40)) r.fail(field, "dimension " + std::to_string(d) + " is " + std::to_string(dim));
      if (t.n_elements > std::numeric_limits<std::uint64_t>::max() / dim) r.fail(field, "element count overflows");
      t.n_elements *= dim;
      t.dims.push_back(dim);
    }
    const auto type_id = r.read<std::uint32_t>(field + " type");
    const auto info = dtype_info(type_id);
    if (!info) r.fail(field, "unknown tensor type id " + std::to_string(type_id));
    t.type = static_cast<DType>(type_id);
    if (t.dims[0] % info->block_size != 0) {
      r.fail(field, "row length " + std::to_string(t.dims[0]) + " is not a multiple of the " + std::string(info->name) +
                        " block size " + std::to_string(info->block_size));
    }
    const std::uint64_t blocks = t.n_elements / info->block_size;
    if (blocks > std::numeric_limits<std::uint64_t>::max() / info->block_bytes) r.fail(field, "byte size overflows");
    t.n_bytes = blocks * info->block_bytes;
    t.offset = r.read<std::uint64_t>(field + " offset");
    if (t.offset % alignment_ != 0) {
      r.fail(field, "data offset " + std::to_string(t.offset) + " is not aligned to " + std::to_string(alignment_));
    }
    if (tensor_index_.count(t.name)) r.fail(field, "duplicate tensor name");
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  const std::uint64_t header_end = r.pos();
  data_offset_ = (header_end + alignment_ - 1) / alignment_ * alignment_;
  const std::uint64_t data_size = data_offset_ <= size ? size - data_offset_ : 0;
  for (TensorInfo& t : tensors_) {
    if (t.offset > data_size || t.n_bytes > data_size - t.offset) {
      throw Error("invalid GGUF file '" + path_ + "': tensor '" + t.name + "': data [" + std::to_string(t.offset) + ", " +
                  std::to_string(t.offset + t.n_bytes) + ") lies outside the data section of " +
                  std::to_string(data_size) + " bytes (file truncated?)");
    }
    t.data = data + data_offset_ + t.offset;
  }
}

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

std::optional<std::int64_t> File::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  return v->as_int(key);
}

std::optional<double> File::get_double(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  return v->as_double(key);
}

std::optional<bool> File::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  return v->as_bool(key);
}

std::optional<std::string> File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  return v->as_string(key);
}

const Array* File::get_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return nullptr;
  return &v->as_array(key);
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace promptly::gguf
