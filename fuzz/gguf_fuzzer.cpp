// libFuzzer target: any byte string handed to the GGUF reader, and whatever it accepts handed on to
// the model, tokenizer and config loaders, must end in success or promptly::Error, never a crash,
// hang, leak or sanitizer report.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "gguf/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace promptly;
  std::shared_ptr<gguf::File> file;
  try {
    file = gguf::File::parse(data, size, "fuzz.gguf");
  } catch (const Error&) {
    return 0;
  }
  for (const auto& [key, value] : file->metadata()) (void)value.to_display_string();
  try {
    Model model(file);
  } catch (const Error&) {
  }
  try {
    Tokenizer tok(Vocab::from_gguf(*file));
    const auto ids = tok.encode("Hello world, caf\xc3\xa9 <s> \xf0\x9f\x98\x80", true, true);
    (void)tok.decode(ids);
  } catch (const Error&) {
  }
  return 0;
}
