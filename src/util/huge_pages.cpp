#include "util/huge_pages.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "util/error.h"

namespace promptly {

namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
}

HugePageBuffer::HugePageBuffer(std::size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  // The kernel backs only whole, aligned 2 MiB ranges with huge pages, and mmap aligns to 4 KiB: map
  // one huge page more and start at the first boundary, so that no part of the buffer is left on
  // small pages (untouched address space costs nothing).
  mapped_size_ = bytes + kHugePage;
  void* p = ::mmap(nullptr, mapped_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    mapped_size_ = 0;
    throw Error("cannot reserve " + std::to_string(bytes >> 20) + " MiB of memory: " + std::strerror(errno));
  }
  mapping_ = p;
  const auto aligned = (reinterpret_cast<std::uintptr_t>(p) + kHugePage - 1) & ~(kHugePage - 1);
  data_ = reinterpret_cast<std::uint8_t*>(aligned);
  // Advice only: where the kernel has transparent huge pages off, the buffer works with small pages.
  ::madvise(data_, bytes, MADV_HUGEPAGE);
}

HugePageBuffer::~HugePageBuffer() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapped_size_);
}

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapped_size_(std::exchange(other.mapped_size_, 0)) {}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this != &other) {
    if (mapping_ != nullptr) ::munmap(mapping_, mapped_size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapped_size_ = std::exchange(other.mapped_size_, 0);
  }
  return *this;
}

}  // namespace promptly
