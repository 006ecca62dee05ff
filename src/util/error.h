#pragma once
// One exception type for everything the user can cause (bad files, bad flags, bad requests).
// Messages are written for the person who has to fix the input: they name the file or field,
// say what was wrong and, where it helps, what would be accepted instead.
#include <stdexcept>
#include <string>

namespace promptly {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace promptly
