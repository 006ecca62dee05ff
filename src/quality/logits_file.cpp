#include "quality/logits_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "util/error.h"
#include "util/file_io.h"

namespace promptly::quality {
namespace {

constexpr char kMagic[8] = {'P', 'R', 'M', 'P', 'T', 'L', 'G', 'T'};
constexpr std::uint32_t kVersion = 1;
constexpr std::uint64_t kFnvOffset = 0xcbf29ce484222325ull, kFnvPrime = 0x100000001b3ull;

std::uint64_t fnv1a(std::uint64_t h, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * kFnvPrime;
  return h;
}

class Reader {
 public:
  Reader(const std::string& data, const std::string& path) : data_(data), path_(path) {}
  template <typename T>
  void read(T* out, std::size_t n, const char* what) {
    const std::size_t bytes = n * sizeof(T);
    if (data_.size() - pos_ < bytes) {
      throw Error("logits file '" + path_ + "' is truncated: " + what + " needs " + std::to_string(bytes) + " bytes at offset " +
                  std::to_string(pos_) + ", the file has " + std::to_string(data_.size()));
    }
    std::memcpy(out, data_.data() + pos_, bytes);
    pos_ += bytes;
  }
  std::size_t pos() const { return pos_; }

 private:
  const std::string& data_;
  const std::string& path_;
  std::size_t pos_ = 0;
};

}  // namespace

LogitsFile LogitsFile::load(const std::string& path) {
  const std::string data = read_file(path, "logits file");
  Reader r(data, path);
  char magic[8];
  r.read(magic, 8, "the magic");
  if (std::memcmp(magic, kMagic, 8) != 0) {
    throw Error("'" + path + "' is not a logits file written by `promptly perplexity --save-logits`");
  }
  std::uint32_t header[6];
  r.read(header, 6, "the header");
  if (header[0] != kVersion) {
    throw Error("logits file '" + path + "' has version " + std::to_string(header[0]) + "; this build reads version " +
                std::to_string(kVersion));
  }
  LogitsFile f;
  f.n_vocab = header[1];
  f.ctx = header[2];
  f.n_chunks = header[3];
  f.first = header[4];
  f.top_k = header[5];
  if (f.ctx < 4 || f.first != f.ctx / 2 || f.n_chunks == 0 || f.top_k == 0 || f.top_k > f.n_vocab) {
    throw Error("logits file '" + path + "' has an inconsistent header (ctx " + std::to_string(f.ctx) + ", first " + std::to_string(f.first) +
                ", chunks " + std::to_string(f.n_chunks) + ", top_k " + std::to_string(f.top_k) + ", vocabulary " +
                std::to_string(f.n_vocab) + ")");
  }
  const std::size_t n_records = static_cast<std::size_t>(f.n_chunks) * (f.ctx - 1 - f.first);
  const std::size_t expected = 8 + sizeof header + sizeof(std::int32_t) * f.n_chunks * f.ctx +
                               n_records * (sizeof(float) + f.top_k * (sizeof(std::int32_t) + sizeof(float))) + sizeof(std::uint64_t);
  if (data.size() != expected) {
    throw Error("logits file '" + path + "' has " + std::to_string(data.size()) + " bytes; its header says " + std::to_string(expected) +
                " (truncated or not written to the end)");
  }
  f.tokens.resize(static_cast<std::size_t>(f.n_chunks) * f.ctx);
  r.read(f.tokens.data(), f.tokens.size(), "the tokens");
  f.actual_logps.resize(n_records);
  f.ids.resize(n_records * f.top_k);
  f.logps.resize(n_records * f.top_k);
  for (std::size_t i = 0; i < n_records; ++i) {
    r.read(&f.actual_logps[i], 1, "a record");
    r.read(f.ids.data() + i * f.top_k, f.top_k, "a record");
    r.read(f.logps.data() + i * f.top_k, f.top_k, "a record");
  }
  const std::uint64_t computed = fnv1a(kFnvOffset, data.data(), r.pos());
  std::uint64_t stored = 0;
  r.read(&stored, 1, "the checksum");
  if (stored != computed) throw Error("logits file '" + path + "' is corrupt: its checksum does not match its contents");
  for (std::int32_t id : f.ids) {
    if (id < 0 || static_cast<std::uint32_t>(id) >= f.n_vocab) throw Error("logits file '" + path + "' holds a token id out of range");
  }
  return f;
}

LogitsWriter::LogitsWriter(const std::string& path, std::uint32_t n_vocab, const ChunkPlan& plan, std::uint32_t top_k,
                           const std::vector<std::int32_t>& chunk_tokens)
    : path_(path), tmp_(path + ".tmp"), top_k_(top_k), hash_(kFnvOffset), expected_(plan.n_scored()) {
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) throw Error("cannot write logits file '" + tmp_ + "': " + std::strerror(errno));
  put(kMagic, 8);
  const std::uint32_t header[6] = {kVersion,
                                   n_vocab,
                                   static_cast<std::uint32_t>(plan.ctx),
                                   static_cast<std::uint32_t>(plan.n_chunks),
                                   static_cast<std::uint32_t>(plan.first),
                                   top_k};
  put(header, sizeof header);
  put(chunk_tokens.data(), chunk_tokens.size() * sizeof(std::int32_t));
}

LogitsWriter::~LogitsWriter() {
  if (f_) {
    std::fclose(f_);
    std::error_code ec;
    std::filesystem::remove(tmp_, ec);
  }
}

void LogitsWriter::put(const void* p, std::size_t n) {
  hash_ = fnv1a(hash_, p, n);
  if (std::fwrite(p, 1, n, f_) != n) throw Error("cannot write logits file '" + tmp_ + "': " + std::strerror(errno));
}

void LogitsWriter::append(float actual_logp, const std::int32_t* ids, const float* logps) {
  put(&actual_logp, sizeof actual_logp);
  put(ids, top_k_ * sizeof(std::int32_t));
  put(logps, top_k_ * sizeof(float));
  ++written_;
}

void LogitsWriter::finish() {
  if (written_ != expected_) {
    throw Error("logits file '" + path_ + "': " + std::to_string(written_) + " records written, " + std::to_string(expected_) + " expected");
  }
  const std::uint64_t h = hash_;
  if (std::fwrite(&h, 1, sizeof h, f_) != sizeof h || std::fclose(f_) != 0) {
    f_ = nullptr;
    throw Error("cannot write logits file '" + tmp_ + "': " + std::strerror(errno));
  }
  f_ = nullptr;
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec) throw Error("cannot move '" + tmp_ + "' to '" + path_ + "': " + ec.message());
}

}  // namespace promptly::quality
