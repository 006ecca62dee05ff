#pragma once
// The small trained model the binary carries (models/README.md), so that `promptly run` and
// `promptly serve` give real output with no model file at hand.
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "gguf/gguf.h"

namespace promptly {

// How the built-in model is named: the `--model` value that selects it, and the model id `serve`
// reports for it.
inline constexpr const char* kBuiltinModelName = "promptly-code-23m";

// The GGUF image as linked into the binary (page-aligned, read-only, mapped from the executable).
std::span<const std::uint8_t> builtin_model_image();

// Parses the image in place (no copy); the File's path() is "builtin:promptly-code-23m".
std::shared_ptr<const gguf::File> open_builtin_model();

// `path` as a model: the built-in one when it is empty or names it, else the GGUF file.
std::shared_ptr<const gguf::File> open_model_file(const std::string& path);

}  // namespace promptly
