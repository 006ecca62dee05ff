#pragma once
// Read-only memory map of a whole file. Model weights are used in place from these pages, so a
// model costs page cache rather than heap, and several processes can share one copy.
#include <cstddef>
#include <cstdint>
#include <string>

namespace promptly {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace promptly
