#pragma once
#include <string>

namespace promptly {

// The whole file as bytes; throws Error "cannot read <what> '<path>': <reason>".
std::string read_file(const std::string& path, const std::string& what = "file");

}  // namespace promptly
