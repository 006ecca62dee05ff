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

  // Drops this process's resident pages for [p, p + n) (whole pages inside the range only). The data
  // stays readable: a later access faults it back in from the file. Used once a tensor has been
  // repacked into memory of its own, so the two copies are not both counted.
  void release(const void* p, std::size_t n) const;

 private:
  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace promptly
