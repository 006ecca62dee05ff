#include "gguf/writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "util/error.h"

namespace promptly::gguf {
namespace {

class Out {
 public:
  explicit Out(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "wb")) {
    if (!f_) throw Error("cannot create '" + path + "': " + std::strerror(errno));
  }
  ~Out() {
    if (f_) {
      std::fclose(f_);
      std::remove(path_.c_str());  // only reached when finish() was not
    }
  }
  void bytes(const void* p, std::size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) throw Error("write to '" + path_ + "' failed: " + std::strerror(errno));
    pos_ += n;
  }
  template <typename T>
  void pod(T v) { bytes(&v, sizeof v); }
  void str(const std::string& s) {
    pod<std::uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(std::uint64_t alignment) {
    static const char zeros[256] = {};
    while (pos_ % alignment) bytes(zeros, std::min<std::uint64_t>(alignment - pos_ % alignment, sizeof zeros));
  }
  void finish() {
    if (std::fclose(f_) != 0) {
      f_ = nullptr;
      std::remove(path_.c_str());
      throw Error("closing '" + path_ + "' failed: " + std::strerror(errno));
    }
    f_ = nullptr;
  }
  std::uint64_t pos() const { return pos_; }

 private:
  std::string path_;
  std::FILE* f_;
  std::uint64_t pos_ = 0;
};

void write_value(Out& out, const Value& v) {
  switch (v.type) {
    case ValueType::UINT8: out.pod(static_cast<std::uint8_t>(std::get<std::uint64_t>(v.data))); break;
    case ValueType::INT8: out.pod(static_cast<std::int8_t>(std::get<std::int64_t>(v.data))); break;
    case ValueType::UINT16: out.pod(static_cast<std::uint16_t>(std::get<std::uint64_t>(v.data))); break;
    case ValueType::INT16: out.pod(static_cast<std::int16_t>(std::get<std::int64_t>(v.data))); break;
    case ValueType::UINT32: out.pod(static_cast<std::uint32_t>(std::get<std::uint64_t>(v.data))); break;
    case ValueType::INT32: out.pod(static_cast<std::int32_t>(std::get<std::int64_t>(v.data))); break;
    case ValueType::UINT64: out.pod(std::get<std::uint64_t>(v.data)); break;
    case ValueType::INT64: out.pod(std::get<std::int64_t>(v.data)); break;
    case ValueType::FLOAT32: out.pod(static_cast<float>(std::get<double>(v.data))); break;
    case ValueType::FLOAT64: out.pod(std::get<double>(v.data)); break;
    case ValueType::BOOL: out.pod(static_cast<std::uint8_t>(std::get<bool>(v.data) ? 1 : 0)); break;
    case ValueType::STRING: out.str(std::get<std::string>(v.data)); break;
    case ValueType::ARRAY: {
      const Array& a = std::get<Array>(v.data);
      out.pod(static_cast<std::uint32_t>(a.elem_type));
      out.pod(static_cast<std::uint64_t>(a.items.size()));
      for (const Value& item : a.items) write_value(out, item);
      break;
    }
  }
}

template <typename T>
Value scalar(ValueType type, T v) {
  Value out;
  out.type = type;
  out.data = v;
  return out;
}

}  // namespace

void Writer::set(const std::string& key, Value value) {
  if (key == "general.alignment") {
    const std::int64_t al = value.as_int(key);
    if (al <= 0 || (al & (al - 1)) != 0) throw Error("general.alignment must be a power of two");
    alignment_ = static_cast<std::uint32_t>(al);
    return;
  }
  for (auto& [k, v] : kv_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  kv_.emplace_back(key, std::move(value));
}

void Writer::set_u32(const std::string& key, std::uint32_t v) { set(key, scalar(ValueType::UINT32, std::uint64_t{v})); }
void Writer::set_i32(const std::string& key, std::int32_t v) { set(key, scalar(ValueType::INT32, std::int64_t{v})); }
void Writer::set_f32(const std::string& key, float v) { set(key, scalar(ValueType::FLOAT32, double{v})); }
void Writer::set_bool(const std::string& key, bool v) { set(key, scalar(ValueType::BOOL, v)); }
void Writer::set_string(const std::string& key, const std::string& v) { set(key, scalar(ValueType::STRING, v)); }

void Writer::set_string_array(const std::string& key, const std::vector<std::string>& v) {
  Array a;
  a.elem_type = ValueType::STRING;
  for (const auto& s : v) a.items.push_back(scalar(ValueType::STRING, s));
  set(key, scalar(ValueType::ARRAY, std::move(a)));
}

void Writer::set_f32_array(const std::string& key, const std::vector<float>& v) {
  Array a;
  a.elem_type = ValueType::FLOAT32;
  for (float f : v) a.items.push_back(scalar(ValueType::FLOAT32, double{f}));
  set(key, scalar(ValueType::ARRAY, std::move(a)));
}

void Writer::set_i32_array(const std::string& key, const std::vector<std::int32_t>& v) {
  Array a;
  a.elem_type = ValueType::INT32;
  for (std::int32_t i : v) a.items.push_back(scalar(ValueType::INT32, std::int64_t{i}));
  set(key, scalar(ValueType::ARRAY, std::move(a)));
}

void Writer::add_tensor(const std::string& name, std::vector<std::uint64_t> dims, DType type, Producer producer) {
  std::uint64_t n = 1;
  for (auto d : dims) n *= d;
  const DTypeInfo& info = dtype_info(type);
  if (dims.empty() || dims[0] % info.block_size != 0) {
    throw Error("tensor '" + name + "': row length is not a multiple of the " + std::string(info.name) + " block size");
  }
  tensors_.push_back({name, std::move(dims), type, n / info.block_size * info.block_bytes, std::move(producer)});
}

void Writer::write(const std::string& path) const {
  Out out(path);
  out.pod<std::uint32_t>(0x46554747);
  out.pod<std::uint32_t>(3);
  out.pod<std::uint64_t>(tensors_.size());
  const bool write_alignment = alignment_ != 32;
  out.pod<std::uint64_t>(kv_.size() + (write_alignment ? 1 : 0));
  if (write_alignment) {
    out.str("general.alignment");
    out.pod(static_cast<std::uint32_t>(ValueType::UINT32));
    out.pod(alignment_);
  }
  for (const auto& [key, value] : kv_) {
    out.str(key);
    out.pod(static_cast<std::uint32_t>(value.type));
    write_value(out, value);
  }
  std::uint64_t offset = 0;
  for (const auto& t : tensors_) {
    out.str(t.name);
    out.pod(static_cast<std::uint32_t>(t.dims.size()));
    for (auto d : t.dims) out.pod<std::uint64_t>(d);
    out.pod(static_cast<std::uint32_t>(t.type));
    out.pod<std::uint64_t>(offset);
    offset += (t.n_bytes + alignment_ - 1) / alignment_ * alignment_;
  }
  out.pad_to(alignment_);
  std::vector<std::uint8_t> buf;
  for (const auto& t : tensors_) {
    buf.assign(t.n_bytes, 0);
    t.producer(buf.data());
    out.bytes(buf.data(), buf.size());
    out.pad_to(alignment_);
  }
  out.finish();
}

}  // namespace promptly::gguf
