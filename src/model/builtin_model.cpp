#include "model/builtin_model.h"

#include <filesystem>

// The assembler copies the file's bytes into .rodata at build time. Page alignment keeps the
// tensors at the same alignment they have in a mapped file (the GGUF aligns them to 32 bytes from
// the image's start), so the kernels read them in place. CMake passes the absolute path and
// rebuilds this object when the model file changes.
asm(".section .rodata.promptly_builtin_model, \"a\", @progbits\n"
    ".balign 4096\n"
    ".global promptly_builtin_model_begin\n"
    "promptly_builtin_model_begin:\n"
    ".incbin \"" PROMPTLY_BUILTIN_MODEL_FILE "\"\n"
    ".global promptly_builtin_model_end\n"
    "promptly_builtin_model_end:\n"
    ".byte 0\n"
    ".previous\n");

extern "C" const std::uint8_t promptly_builtin_model_begin[];
extern "C" const std::uint8_t promptly_builtin_model_end[];

namespace promptly {

std::span<const std::uint8_t> builtin_model_image() {
  return {promptly_builtin_model_begin, static_cast<std::size_t>(promptly_builtin_model_end - promptly_builtin_model_begin)};
}

std::shared_ptr<const gguf::File> open_builtin_model() {
  const std::span<const std::uint8_t> image = builtin_model_image();
  return gguf::File::parse(image.data(), image.size(), std::string("builtin:") + kBuiltinModelName);
}

std::shared_ptr<const gguf::File> open_model_file(const std::string& path) {
  // A file of that name wins over the built-in model, so no existing path changes meaning.
  if (path.empty() || (path == kBuiltinModelName && !std::filesystem::exists(path))) return open_builtin_model();
  return gguf::File::open(path);
}

}  // namespace promptly
