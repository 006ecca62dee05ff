#include "gguf/gguf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../test_util.h"
#include "gguf/writer.h"
#include "util/error.h"

namespace promptly::gguf {
namespace {

Value int_value(ValueType t, std::int64_t v) {
  Value out;
  out.type = t;
  if (t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 || t == ValueType::UINT64) {
    out.data = static_cast<std::uint64_t>(v);
  } else {
    out.data = v;
  }
  return out;
}

std::string write_sample(const std::string& path) {
  Writer w;
  w.set("u8", int_value(ValueType::UINT8, 200));
  w.set("i8", int_value(ValueType::INT8, -100));
  w.set("u16", int_value(ValueType::UINT16, 60000));
  w.set("i16", int_value(ValueType::INT16, -30000));
  w.set_u32("u32", 4000000000u);
  w.set_i32("i32", -2000000000);
  w.set("u64", int_value(ValueType::UINT64, 1LL << 50));
  w.set("i64", int_value(ValueType::INT64, -(1LL << 50)));
  w.set_f32("f32", 1.5f);
  Value f64;
  f64.type = ValueType::FLOAT64;
  f64.data = 2.25;
  w.set("f64", f64);
  w.set_bool("flag", true);
  w.set_string("name", "h\xc3\xa9llo");
  w.set_string_array("strings", {"a", "", "ccc"});
  // nested: array of arrays of int32
  Array inner1{ValueType::INT32, {int_value(ValueType::INT32, 1), int_value(ValueType::INT32, 2)}};
  Array inner2{ValueType::INT32, {}};
  Value v1, v2, outer;
  v1.type = v2.type = ValueType::ARRAY;
  v1.data = inner1;
  v2.data = inner2;
  outer.type = ValueType::ARRAY;
  outer.data = Array{ValueType::ARRAY, {v1, v2}};
  w.set("nested", outer);
  w.add_tensor("a", {4, 2}, DType::F32, [](std::uint8_t* out) {
    for (int i = 0; i < 8; ++i) {
      const float f = static_cast<float>(i);
      std::memcpy(out + 4 * i, &f, 4);
    }
  });
  w.add_tensor("b", {64}, DType::Q8_0, [](std::uint8_t* out) { std::memset(out, 7, 68); });
  w.write(path);
  return path;
}

TEST(Gguf, WriterReaderRoundTripsEveryValueType) {
  test::TempDir dir;
  auto f = File::open(write_sample(dir.file("s.gguf")));
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->get_int("u8"), 200);
  EXPECT_EQ(f->get_int("i8"), -100);
  EXPECT_EQ(f->get_int("u16"), 60000);
  EXPECT_EQ(f->get_int("i16"), -30000);
  EXPECT_EQ(f->get_int("u32"), 4000000000LL);
  EXPECT_EQ(f->get_int("i32"), -2000000000);
  EXPECT_EQ(f->get_int("u64"), 1LL << 50);
  EXPECT_EQ(f->get_int("i64"), -(1LL << 50));
  EXPECT_EQ(f->get_double("f32"), 1.5);
  EXPECT_EQ(f->get_double("f64"), 2.25);
  EXPECT_EQ(f->get_bool("flag"), true);
  EXPECT_EQ(f->get_string("name"), "h\xc3\xa9llo");
  const Array* s = f->get_array("strings");
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(s->items.size(), 3u);
  EXPECT_EQ(s->items[2].as_string("strings"), "ccc");
  const Array* nested = f->get_array("nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->items.size(), 2u);
  EXPECT_EQ(nested->items[0].as_array("n").items[1].as_int("n"), 2);
  EXPECT_TRUE(nested->items[1].as_array("n").items.empty());
  EXPECT_THROW((void)f->get_string("u8"), Error);  // wrong type is an error, not a default
  EXPECT_FALSE(f->get_int("missing").has_value());

  const TensorInfo* a = f->find_tensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dims, (std::vector<std::uint64_t>{4, 2}));
  EXPECT_EQ(a->n_bytes, 32u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a->data) % 32, 0u);
  float v;
  std::memcpy(&v, a->data + 4 * 7, 4);
  EXPECT_EQ(v, 7.0f);
  const TensorInfo* b = f->find_tensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, DType::Q8_0);
  EXPECT_EQ(b->n_bytes, 68u);
  EXPECT_EQ(b->offset % 32, 0u);
}

TEST(Gguf, ReadsTheSharedModel) {
  auto f = File::open(test::shared_model("stories260K.gguf"));
  EXPECT_EQ(f->tensors().size(), 48u);
  EXPECT_EQ(f->metadata().size(), 19u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_array("tokenizer.ggml.tokens")->items.size(), 512u);
}

// Every way a file can be broken must surface as Error with the file name in it.
void expect_invalid(const std::vector<std::uint8_t>& bytes, const std::string& needle) {
  try {
    File::parse(bytes.data(), bytes.size(), "broken.gguf");
    FAIL() << "accepted a corrupt file; expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("broken.gguf"), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

std::vector<std::uint8_t> sample_bytes() {
  test::TempDir dir;
  const std::string s = test::read_file(write_sample(dir.file("s.gguf")));
  return {s.begin(), s.end()};
}

template <typename T>
void put(std::vector<std::uint8_t>& b, std::size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof v);
}

TEST(GgufCorrupt, TruncatedAtEveryOffset) {
  const auto bytes = sample_bytes();
  std::size_t rejected = 0;
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    std::vector<std::uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<long>(n));
    try {
      File::parse(cut.data(), cut.size(), "broken.gguf");
    } catch (const Error&) {
      ++rejected;
    }
  }
  // Only cuts inside the trailing padding of the last tensor can still be valid.
  EXPECT_GE(rejected, bytes.size() - 32);
}

TEST(GgufCorrupt, BadMagicAndVersion) {
  auto b = sample_bytes();
  b[0] = 'X';
  expect_invalid(b, "not a GGUF file");
  b = sample_bytes();
  put<std::uint32_t>(b, 4, 1);
  expect_invalid(b, "version 1 is not supported");
  put<std::uint32_t>(b, 4, 99);
  expect_invalid(b, "version 99");
}

TEST(GgufCorrupt, AbsurdCounts) {
  auto b = sample_bytes();
  put<std::uint64_t>(b, 8, 1ull << 60);
  expect_invalid(b, "tensor_count");
  b = sample_bytes();
  put<std::uint64_t>(b, 16, 1ull << 62);
  expect_invalid(b, "metadata_kv_count");
}

TEST(GgufCorrupt, AbsurdStringLength) {
  auto b = sample_bytes();
  put<std::uint64_t>(b, 24, 1ull << 40);  // length of the first key
  expect_invalid(b, "string length");
}

std::vector<std::uint8_t> header(std::uint64_t n_tensors, std::uint64_t n_kv) {
  std::vector<std::uint8_t> b(24);
  put<std::uint32_t>(b, 0, 0x46554747);
  put<std::uint32_t>(b, 4, 3);
  put<std::uint64_t>(b, 8, n_tensors);
  put<std::uint64_t>(b, 16, n_kv);
  return b;
}
template <typename T>
void append(std::vector<std::uint8_t>& b, T v) {
  b.resize(b.size() + sizeof v);
  std::memcpy(b.data() + b.size() - sizeof v, &v, sizeof v);
}
void append_str(std::vector<std::uint8_t>& b, const std::string& s) {
  append<std::uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}

TEST(GgufCorrupt, AbsurdArrayLengthAndUnknownTypes) {
  auto b = header(0, 1);
  append_str(b, "arr");
  append<std::uint32_t>(b, 9);  // array
  append<std::uint32_t>(b, 6);  // of float32
  append<std::uint64_t>(b, 1ull << 61);
  b.resize(b.size() + 64);
  expect_invalid(b, "array length");

  b = header(0, 1);
  append_str(b, "k");
  append<std::uint32_t>(b, 77);
  b.resize(b.size() + 16);
  expect_invalid(b, "unknown value type 77");

  b = header(0, 1);
  append_str(b, "k");
  append<std::uint32_t>(b, 9);
  append<std::uint32_t>(b, 55);
  append<std::uint64_t>(b, 1);
  b.resize(b.size() + 16);
  expect_invalid(b, "unknown array element type 55");
}

TEST(GgufCorrupt, DeeplyNestedArrays) {
  auto b = header(0, 1);
  append_str(b, "deep");
  append<std::uint32_t>(b, 9);
  for (int i = 0; i < 20; ++i) {
    append<std::uint32_t>(b, 9);
    append<std::uint64_t>(b, 1);
  }
  b.resize(b.size() + 64);
  expect_invalid(b, "nested deeper");
}

std::vector<std::uint8_t> one_tensor(std::uint32_t n_dims, std::vector<std::uint64_t> dims, std::uint32_t type, std::uint64_t offset,
                                     std::size_t data_bytes) {
  auto b = header(1, 0);
  append_str(b, "t");
  append<std::uint32_t>(b, n_dims);
  for (auto d : dims) append<std::uint64_t>(b, d);
  append<std::uint32_t>(b, type);
  append<std::uint64_t>(b, offset);
  b.resize((b.size() + 31) / 32 * 32 + data_bytes);
  return b;
}

TEST(GgufCorrupt, TensorInfos) {
  EXPECT_NO_THROW({
    auto ok = one_tensor(2, {4, 2}, 0, 0, 32);
    File::parse(ok.data(), ok.size(), "ok.gguf");
  });
  expect_invalid(one_tensor(2, {4, 2}, 0, 0, 31), "outside the data section");
  expect_invalid(one_tensor(2, {4, 2}, 0, 32, 32), "outside the data section");
  expect_invalid(one_tensor(2, {4, 2}, 0, (1ull << 63) + 3, 32), "not aligned");
  expect_invalid(one_tensor(2, {4, 2}, 0, (1ull << 63) + 32 * 7, 32), "outside the data section");
  expect_invalid(one_tensor(2, {4, 2}, 1000, 0, 32), "unknown tensor type id 1000");
  expect_invalid(one_tensor(7, {1, 1, 1, 1, 1, 1, 1}, 0, 0, 32), "n_dims");
  expect_invalid(one_tensor(2, {0, 2}, 0, 0, 32), "dimension 0");
  expect_invalid(one_tensor(2, {1ull << 40, 1ull << 40}, 0, 0, 32), "overflows");
  expect_invalid(one_tensor(1, {33}, 8, 0, 64), "not a multiple of the Q8_0 block size");
}

TEST(GgufCorrupt, BadAlignment) {
  auto b = header(0, 1);
  append_str(b, "general.alignment");
  append<std::uint32_t>(b, 4);
  append<std::uint32_t>(b, 24);
  expect_invalid(b, "power of two");
}

TEST(GgufCorrupt, DuplicateKeys) {
  auto b = header(0, 2);
  for (int i = 0; i < 2; ++i) {
    append_str(b, "k");
    append<std::uint32_t>(b, 4);
    append<std::uint32_t>(b, 1);
  }
  expect_invalid(b, "duplicate key");
}

TEST(Gguf, MissingFileIsAClearError) {
  try {
    File::open("/nonexistent/model.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf"), std::string::npos);
  }
}

}  // namespace
}  // namespace promptly::gguf
