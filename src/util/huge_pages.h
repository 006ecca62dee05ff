#pragma once
// Large, long-lived buffers read in scattered pieces (the paged KV cache) pay a TLB miss on almost
// every piece when backed by 4 KiB pages: a 16-token block of one layer is a few KiB and the next
// block of the same sequence can be anywhere in a pool of gigabytes. Backing them with transparent
// huge pages (2 MiB) removes those misses. The memory is an anonymous mapping: untouched pages stay
// non-resident (and zero) until written, so a budget sized up front costs nothing until used.
#include <cstddef>
#include <cstdint>

namespace promptly {

class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  // Throws Error when the address space cannot be reserved.
  explicit HugePageBuffer(std::size_t bytes);
  ~HugePageBuffer();
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  std::uint8_t* data_ = nullptr;  // the first 2 MiB boundary of the mapping
  std::size_t size_ = 0;
  void* mapping_ = nullptr;
  std::size_t mapped_size_ = 0;
};

}  // namespace promptly
