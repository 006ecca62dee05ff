// The model the binary carries: where it comes from, and that it loads and runs in place.
#include "model/builtin_model.h"

#include <gtest/gtest.h>

#include <cstring>

#include "../test_util.h"
#include "convert/quantize.h"
#include "engine/generate.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace promptly {
namespace {

// models/README.md says how the file was made; this checks it byte for byte, so the shipped model
// can always be rebuilt from the shared F16 weights.
TEST(BuiltinModel, IsTheQ8_0QuantizationOfTheSharedCodeTarget) {
  test::TempDir dir;
  ThreadPool pool(2);
  quantize_model(test::shared_model("code/code-target-f16.gguf"), dir.file("q8.gguf"), "Q8_0", pool);
  const std::string expected = test::read_file(dir.file("q8.gguf"));
  const std::span<const std::uint8_t> image = builtin_model_image();
  ASSERT_EQ(image.size(), expected.size());
  EXPECT_EQ(std::memcmp(image.data(), expected.data(), expected.size()), 0);
}

TEST(BuiltinModel, LoadsInPlaceAndCompletesPython) {
  const auto file = open_builtin_model();
  EXPECT_EQ(file->path(), "builtin:promptly-code-23m");
  for (const auto& t : file->tensors()) EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data) % file->alignment(), 0u) << t.name;
  Model model(file);
  EXPECT_EQ(model.config().n_vocab, 8192u);
  Tokenizer tokenizer(Vocab::from_gguf(*file));
  ThreadPool pool(2);
  GenerateOptions options;
  options.max_tokens = 24;
  options.sampling.temperature = 0;
  const GenerateResult r = generate(model, tokenizer, tokenizer.encode("import os\n\ndef list_files(path):", true, false), options, pool);
  EXPECT_EQ(r.ids.size(), 24u);
  EXPECT_EQ(r.text.rfind("\n    ", 0), 0u) << r.text;  // an indented body
}

TEST(BuiltinModel, AnEmptyPathOrItsNameSelectsIt) {
  EXPECT_EQ(open_model_file("")->path(), "builtin:promptly-code-23m");
  EXPECT_EQ(open_model_file(kBuiltinModelName)->path(), "builtin:promptly-code-23m");
  EXPECT_EQ(open_model_file(test::shared_model("stories260K.gguf"))->path(), test::shared_model("stories260K.gguf"));
}

}  // namespace
}  // namespace promptly
