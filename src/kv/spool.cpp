#include "kv/spool.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "kv/kv_cache.h"
#include "util/error.h"
#include "util/hash.h"

namespace promptly {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'P', 'K', 'V', 'S', 'P', 'O', 'O', 'L'};
constexpr std::uint32_t kVersion = 1;
constexpr const char* kSuffix = ".kvb";
constexpr const char* kTempPrefix = ".tmp-";

// The fixed part of a block file's header; the block's tokens (int32 each) and the header's own
// checksum (uint64 over everything before it) follow, then the data. Little-endian, as written by
// the x86-64 hosts this runs on.
struct FixedHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t header_bytes;  // fixed part + tokens + header checksum: where the data starts
  std::uint64_t model_fingerprint;
  std::uint32_t kv_type;       // KvType: 0 F32, 1 F16, 2 Q8_0
  std::uint32_t block_tokens, n_layers, kv_dim, segment_dim, n_tokens;
  std::uint64_t first_position;
  std::uint64_t parent_hash, chain_hash;
  std::uint64_t data_bytes, data_checksum;
};
static_assert(sizeof(FixedHeader) == 88);

std::size_t header_bytes_for(std::size_t n_tokens) { return sizeof(FixedHeader) + 4 * n_tokens + 8; }

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

bool write_all(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* data, std::size_t n, std::uint64_t offset) {
  auto* p = static_cast<std::uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
  return true;
}

// A parsed, self-consistent header (magic, version, sizes and header checksum checked).
struct ParsedHeader {
  FixedHeader fixed{};
  std::vector<std::int32_t> tokens;
};

enum class HeaderCheck { Ok, Truncated, Bad };

HeaderCheck read_header(int fd, std::uint64_t file_size, ParsedHeader& out) {
  if (file_size < sizeof(FixedHeader)) return HeaderCheck::Truncated;
  if (!read_all(fd, &out.fixed, sizeof(FixedHeader), 0)) return HeaderCheck::Truncated;
  const FixedHeader& h = out.fixed;
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.version != kVersion) return HeaderCheck::Bad;
  if (h.n_tokens == 0 || h.n_tokens > (1u << 16) || h.header_bytes != header_bytes_for(h.n_tokens)) return HeaderCheck::Bad;
  if (file_size < h.header_bytes) return HeaderCheck::Truncated;
  std::vector<std::uint8_t> raw(h.header_bytes);
  if (!read_all(fd, raw.data(), raw.size(), 0)) return HeaderCheck::Truncated;
  std::uint64_t stored;
  std::memcpy(&stored, raw.data() + raw.size() - 8, 8);
  if (hash_bytes(raw.data(), raw.size() - 8) != stored) return HeaderCheck::Bad;
  if (file_size != h.header_bytes + h.data_bytes) return file_size < h.header_bytes + h.data_bytes ? HeaderCheck::Truncated : HeaderCheck::Bad;
  out.tokens.resize(h.n_tokens);
  std::memcpy(out.tokens.data(), raw.data() + sizeof(FixedHeader), 4 * h.n_tokens);
  return HeaderCheck::Ok;
}

bool same_settings(const FixedHeader& h, const SpoolSettings& s) {
  return h.kv_type == static_cast<std::uint32_t>(s.kv_type) && h.block_tokens == s.block_tokens && h.n_layers == s.n_layers &&
         h.kv_dim == s.kv_dim && h.segment_dim == s.segment_dim && h.data_bytes == s.block_bytes;
}

std::uint64_t mtime_ns(const struct stat& st) {
  return static_cast<std::uint64_t>(st.st_mtim.tv_sec) * 1000000000ULL + static_cast<std::uint64_t>(st.st_mtim.tv_nsec);
}

}  // namespace

ChainHash chain_hash(ChainHash parent, std::span<const std::int32_t> tokens) {
  // Never 0, which stands for "no parent".
  const ChainHash h = hash_bytes(tokens.data(), tokens.size_bytes(), parent ^ 0x6b76737031ULL);
  return h == 0 ? 1 : h;
}

void extend_chain(std::vector<ChainHash>& chain, std::span<const std::int32_t> tokens, std::size_t block_tokens, std::size_t n_blocks) {
  n_blocks = std::min(n_blocks, tokens.size() / block_tokens);
  while (chain.size() < n_blocks) {
    const std::size_t i = chain.size();
    chain.push_back(chain_hash(i == 0 ? 0 : chain[i - 1], tokens.subspan(i * block_tokens, block_tokens)));
  }
}

SpoolSettings SpoolSettings::of(std::uint64_t model_fingerprint, const BlockPool& pool, std::size_t n_layers) {
  SpoolSettings s;
  s.model_fingerprint = model_fingerprint;
  s.kv_type = pool.type();
  s.block_tokens = static_cast<std::uint32_t>(pool.block_tokens());
  s.n_layers = static_cast<std::uint32_t>(n_layers);
  s.kv_dim = static_cast<std::uint32_t>(pool.kv_dim());
  s.segment_dim = static_cast<std::uint32_t>(pool.segment_dim());
  s.block_bytes = BlockPool::block_bytes(n_layers, pool.kv_dim(), pool.block_tokens(), pool.type());
  return s;
}

std::uint64_t SpoolSettings::id() const {
  std::uint64_t h = hash_combine(model_fingerprint, static_cast<std::uint64_t>(kv_type));
  for (std::uint64_t v : {std::uint64_t{block_tokens}, std::uint64_t{n_layers}, std::uint64_t{kv_dim}, std::uint64_t{segment_dim}, block_bytes,
                          std::uint64_t{kVersion}}) {
    h = hash_combine(h, v);
  }
  return h;
}

const char* spool_reject_name(SpoolReject r) {
  switch (r) {
    case SpoolReject::Torn: return "torn";
    case SpoolReject::Truncated: return "truncated";
    case SpoolReject::Header: return "header";
    case SpoolReject::Checksum: return "checksum";
    case SpoolReject::Model: return "model";
    case SpoolReject::Settings: return "settings";
    case SpoolReject::Io: return "io";
    case SpoolReject::kCount: break;
  }
  return "?";
}

KvSpool::KvSpool(SpoolOptions options, SpoolSettings settings)
    : options_(std::move(options)), settings_(settings), name_prefix_(hex64(settings.id()) + "-") {
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  if (ec || ::access(options_.dir.c_str(), R_OK | W_OK | X_OK) != 0) {
    std::fprintf(stderr, "promptly: warning: KV spool disabled: cannot use directory '%s' (%s); serving goes on without it\n",
                 options_.dir.c_str(), ec ? ec.message().c_str() : std::strerror(errno));
    return;
  }
  enabled_ = true;
  scan();
  writer_ = std::thread([this] { writer_loop(); });
  reader_ = std::thread([this] { reader_loop(); });
}

KvSpool::~KvSpool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (reader_.joinable()) reader_.join();
  // Reads never started: their callers must not wait forever.
  for (ReadJob& job : reads_) job.result->done.store(true, std::memory_order_release);
}

std::string KvSpool::path_of(ChainHash hash) const { return options_.dir + "/" + name_prefix_ + hex64(hash) + kSuffix; }

void KvSpool::reject(SpoolReject why) { ++counters_.rejected[static_cast<std::size_t>(why)]; }

void KvSpool::scan() {
  std::size_t dropped = 0, foreign = 0;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(options_.dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string path = entry.path().string();
    if (name.rfind(kTempPrefix, 0) == 0) {  // a write the process did not finish (killed mid-write)
      ::unlink(path.c_str());
      reject(SpoolReject::Torn);
      ++dropped;
      continue;
    }
    if (name.size() < 4 || name.compare(name.size() - 4, 4, kSuffix) != 0) continue;  // not ours
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    ParsedHeader h;
    const HeaderCheck check = ::fstat(fd, &st) == 0 ? read_header(fd, static_cast<std::uint64_t>(st.st_size), h) : HeaderCheck::Bad;
    ::close(fd);
    if (check != HeaderCheck::Ok) {
      ::unlink(path.c_str());
      reject(check == HeaderCheck::Truncated ? SpoolReject::Truncated : SpoolReject::Header);
      ++dropped;
      continue;
    }
    if (name.rfind(name_prefix_, 0) != 0 || h.fixed.model_fingerprint != settings_.model_fingerprint || !same_settings(h.fixed, settings_)) {
      // Another model's or other settings' block: never used, left for whoever wrote it.
      reject(h.fixed.model_fingerprint != settings_.model_fingerprint ? SpoolReject::Model : SpoolReject::Settings);
      ++foreign;
      continue;
    }
    if (name != name_prefix_ + hex64(h.fixed.chain_hash) + kSuffix) {
      ::unlink(path.c_str());
      reject(SpoolReject::Header);
      ++dropped;
      continue;
    }
    add_entry(h.fixed.chain_hash, h.fixed.parent_hash, static_cast<std::uint64_t>(st.st_size), mtime_ns(st));
  }
  if (dropped > 0 || foreign > 0) {
    std::fprintf(stderr,
                 "promptly: warning: KV spool '%s': %zu damaged or unfinished block files deleted, %zu of another model or KV settings ignored "
                 "(kv_spool_rejected_total has the reasons)\n",
                 options_.dir.c_str(), dropped, foreign);
  }
  evict_over_cap();
}

bool KvSpool::is_leaf(ChainHash hash) const {
  auto it = children_of_.find(hash);
  return it == children_of_.end() || it->second == 0;
}

void KvSpool::add_entry(ChainHash hash, ChainHash parent, std::uint64_t bytes, std::uint64_t last_used) {
  remove_entry(hash);
  index_[hash] = Entry{parent, bytes, last_used};
  bytes_ += bytes;
  if (parent != 0 && children_of_[parent]++ == 0) {
    if (auto p = index_.find(parent); p != index_.end()) leaves_.erase({p->second.last_used, parent});
  }
  if (is_leaf(hash)) leaves_.insert({last_used, hash});
}

void KvSpool::remove_entry(ChainHash hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) return;
  const Entry e = it->second;
  if (is_leaf(hash)) leaves_.erase({e.last_used, hash});
  bytes_ -= e.bytes;
  index_.erase(it);
  if (e.parent == 0) return;
  auto c = children_of_.find(e.parent);
  if (c == children_of_.end()) return;
  if (--c->second == 0) {
    children_of_.erase(c);
    if (auto p = index_.find(e.parent); p != index_.end()) leaves_.insert({p->second.last_used, e.parent});
  }
}

void KvSpool::touch(ChainHash hash, std::uint64_t now) {
  auto it = index_.find(hash);
  if (it == index_.end()) return;
  Entry& e = it->second;
  if (is_leaf(hash)) {
    leaves_.erase({e.last_used, hash});
    leaves_.insert({now, hash});
  }
  e.last_used = now;
}

void KvSpool::evict_over_cap() {
  while (bytes_ > options_.max_bytes && !leaves_.empty()) {
    const ChainHash victim = leaves_.begin()->second;
    ::unlink(path_of(victim).c_str());
    remove_entry(victim);
    ++counters_.evicted;
  }
}

void KvSpool::disable(const std::string& why) {
  if (!enabled_) return;
  enabled_ = false;
  writes_.clear();
  queued_.clear();
  queued_bytes_ = 0;
  std::fprintf(stderr, "promptly: warning: KV spool '%s' disabled: %s; serving goes on without it\n", options_.dir.c_str(), why.c_str());
}

bool KvSpool::enabled() const {
  std::lock_guard lock(mutex_);
  return enabled_;
}

bool KvSpool::contains(ChainHash hash) const {
  std::lock_guard lock(mutex_);
  return index_.count(hash) > 0 || queued_.count(hash) > 0;
}

std::size_t KvSpool::present_run(std::span<const ChainHash> chain, std::size_t first) const {
  std::lock_guard lock(mutex_);
  if (!enabled_) return 0;
  std::size_t n = 0;
  while (first + n < chain.size() && index_.count(chain[first + n]) > 0) ++n;
  return n;
}

namespace {

std::size_t total_bytes(const auto& parts) {
  std::size_t n = 0;
  for (const auto& p : parts) n += p.size();
  return n;
}

}  // namespace

KvSpool::Admit KvSpool::admit(ChainHash hash, bool wait_for_room, std::unique_lock<std::mutex>& lock) {
  if (wait_for_room) {
    written_.wait(lock, [&] { return !enabled_ || queued_bytes_ + settings_.block_bytes <= options_.write_queue_bytes; });
  }
  if (!enabled_) return Admit::No;
  if (index_.count(hash) > 0 || queued_.count(hash) > 0) return Admit::AlreadyThere;
  if (queued_bytes_ + settings_.block_bytes > options_.write_queue_bytes) {
    ++counters_.write_dropped;
    return Admit::No;
  }
  return Admit::Queue;
}

bool KvSpool::enqueue(WriteJob job, std::unique_lock<std::mutex>& lock) {
  if (!enabled_) return false;  // disabled while the copy was made outside the lock
  queued_[job.hash] = true;
  queued_bytes_ += settings_.block_bytes;
  writes_.push_back(std::move(job));
  lock.unlock();
  work_.notify_all();
  return true;
}

bool KvSpool::write(ChainHash hash, ChainHash parent, std::uint64_t position, std::span<const std::int32_t> tokens,
                    const std::vector<std::span<const std::uint8_t>>& parts, bool wait_for_room) {
  if (total_bytes(parts) != settings_.block_bytes) throw Error("internal: a spooled KV block of the wrong size");
  std::unique_lock lock(mutex_);
  const Admit admitted = admit(hash, wait_for_room, lock);
  if (admitted != Admit::Queue) return admitted == Admit::AlreadyThere;
  WriteJob job{hash, parent, position, std::vector<std::int32_t>(tokens.begin(), tokens.end()), {}, nullptr};
  if (!spare_buffers_.empty()) {
    job.data = std::move(spare_buffers_.back());
    spare_buffers_.pop_back();
  }
  lock.unlock();
  // The copy outside the lock: the writer may be busy with the index meanwhile.
  job.data.clear();
  for (const auto& part : parts) job.data.insert(job.data.end(), part.begin(), part.end());
  lock.lock();
  return enqueue(std::move(job), lock);
}

bool KvSpool::write(ChainHash hash, ChainHash parent, std::uint64_t position, std::span<const std::int32_t> tokens,
                    std::shared_ptr<PendingBlock> pending, bool wait_for_room) {
  if (!pending) throw Error("internal: a spooled KV block with no bytes");
  std::unique_lock lock(mutex_);
  const Admit admitted = admit(hash, wait_for_room, lock);
  if (admitted != Admit::Queue) return admitted == Admit::AlreadyThere;
  WriteJob job{hash, parent, position, std::vector<std::int32_t>(tokens.begin(), tokens.end()), {}, nullptr};
  job.pending = std::move(pending);
  return enqueue(std::move(job), lock);
}

void KvSpool::count_dropped_write() {
  std::lock_guard lock(mutex_);
  ++counters_.write_dropped;
}

bool KvSpool::write_file(const WriteJob& job, std::span<const std::uint8_t> data) {
  FixedHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.header_bytes = static_cast<std::uint32_t>(header_bytes_for(job.tokens.size()));
  h.model_fingerprint = settings_.model_fingerprint;
  h.kv_type = static_cast<std::uint32_t>(settings_.kv_type);
  h.block_tokens = settings_.block_tokens;
  h.n_layers = settings_.n_layers;
  h.kv_dim = settings_.kv_dim;
  h.segment_dim = settings_.segment_dim;
  h.n_tokens = static_cast<std::uint32_t>(job.tokens.size());
  h.first_position = job.position;
  h.parent_hash = job.parent;
  h.chain_hash = job.hash;
  h.data_bytes = data.size();
  h.data_checksum = hash_bytes(data.data(), data.size());
  std::vector<std::uint8_t> header(h.header_bytes);
  std::memcpy(header.data(), &h, sizeof h);
  std::memcpy(header.data() + sizeof h, job.tokens.data(), 4 * job.tokens.size());
  const std::uint64_t header_sum = hash_bytes(header.data(), header.size() - 8);
  std::memcpy(header.data() + header.size() - 8, &header_sum, 8);

  const std::string final_path = path_of(job.hash);
  const std::string temp_path = options_.dir + "/" + kTempPrefix + std::to_string(::getpid()) + "-" + hex64(job.hash);
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const bool ok = write_all(fd, header.data(), header.size()) && write_all(fd, data.data(), data.size());
  const bool closed = ::close(fd) == 0;
  if (!ok || !closed || ::rename(temp_path.c_str(), final_path.c_str()) != 0) {
    ::unlink(temp_path.c_str());
    return false;
  }
  return true;
}

void KvSpool::writer_loop() {
  // Writes are never urgent, steps are: the writer runs only on a core nobody else wants (a
  // compute thread it displaced would hold up the whole step at its next barrier). Under sustained
  // full load the queue fills and writes are skipped, which is the documented trade.
  sched_param idle{};
  pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || !writes_.empty(); });
    if (stopping_) return;
    WriteJob job = std::move(writes_.front());
    writes_.pop_front();
    writing_ = true;
    lock.unlock();
    // A device's block: its bytes may still be on their way (waited for here, never by a step).
    const std::span<const std::uint8_t> data = job.pending ? job.pending->wait() : std::span<const std::uint8_t>(job.data);
    const bool arrived = data.size() == settings_.block_bytes;
    const bool ok = !arrived || write_file(job, data);
    const int err = errno;
    job.pending.reset();  // gives the device its staging memory back
    lock.lock();
    writing_ = false;
    queued_.erase(job.hash);
    queued_bytes_ -= std::min<std::uint64_t>(queued_bytes_, settings_.block_bytes);
    if (!arrived) {
      ++counters_.write_dropped;
    } else if (ok) {
      add_entry(job.hash, job.parent, header_bytes_for(job.tokens.size()) + data.size(), now_ns());
      ++counters_.written;
      evict_over_cap();
    } else {
      reject(SpoolReject::Io);
      disable(std::string("writing a block failed (") + std::strerror(err) + ")");
    }
    if (job.data.capacity() > 0 && spare_buffers_.size() < 32) spare_buffers_.push_back(std::move(job.data));
    written_.notify_all();
  }
}

bool KvSpool::read_file(const ReadJob& job) {
  const std::string path = path_of(job.hash);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::lock_guard lock(mutex_);
    remove_entry(job.hash);  // evicted or removed meanwhile
    reject(SpoolReject::Io);
    return false;
  }
  struct stat st {};
  ParsedHeader h;
  HeaderCheck check = ::fstat(fd, &st) == 0 ? read_header(fd, static_cast<std::uint64_t>(st.st_size), h) : HeaderCheck::Bad;
  SpoolReject why = check == HeaderCheck::Truncated ? SpoolReject::Truncated : SpoolReject::Header;
  bool ok = check == HeaderCheck::Ok;
  if (ok && (h.fixed.chain_hash != job.hash || h.fixed.first_position != job.position || h.tokens != job.tokens ||
             h.fixed.model_fingerprint != settings_.model_fingerprint || !same_settings(h.fixed, settings_))) {
    ok = false;  // not the block asked for (a hash collision, or a file renamed by hand)
    why = SpoolReject::Header;
  }
  // One run is read in place; a block in several (local layers apart), or for a sink, through a
  // buffer, scattered once its checksum holds (runs with no memory, for KV the block does not keep,
  // are skipped).
  const bool in_place = !job.sink && job.dst.size() == 1 && job.dst[0].data() != nullptr;
  if (!in_place) read_buffer_.resize(settings_.block_bytes);
  std::uint8_t* data = in_place ? job.dst[0].data() : read_buffer_.data();
  if (ok && !read_all(fd, data, settings_.block_bytes, h.fixed.header_bytes)) {
    ok = false;
    why = SpoolReject::Truncated;
  }
  if (ok && hash_bytes(data, settings_.block_bytes) != h.fixed.data_checksum) {
    ok = false;
    why = SpoolReject::Checksum;
  }
  bool stored = true;  // false: the file is sound, but its bytes found no place (a device error)
  if (ok && job.sink) {
    stored = job.sink(std::span<const std::uint8_t>(data, settings_.block_bytes));
  } else if (ok && !in_place) {
    for (std::span<std::uint8_t> part : job.dst) {
      if (part.data()) std::memcpy(part.data(), data, part.size());
      data += part.size();
    }
  }
  if (ok && stored) ::futimens(fd, nullptr);  // last used now: the LRU order survives a restart
  ::close(fd);
  std::lock_guard lock(mutex_);
  if (ok && !stored) {
    reject(SpoolReject::Io);
    std::fprintf(stderr, "promptly: warning: KV spool block %s could not be stored in the device's KV cache: its tokens are recomputed\n",
                 path.c_str());
    return false;
  }
  if (ok) {
    touch(job.hash, now_ns());
    ++counters_.read_blocks;
  } else {
    ::unlink(path.c_str());
    remove_entry(job.hash);
    reject(why);
    std::fprintf(stderr, "promptly: warning: KV spool block %s was damaged (%s): deleted, its tokens are recomputed\n", path.c_str(),
                 spool_reject_name(why));
  }
  return ok;
}

std::shared_ptr<const KvSpool::Read> KvSpool::read(ChainHash hash, std::uint64_t position, std::span<const std::int32_t> tokens,
                                                   std::vector<std::span<std::uint8_t>> dst) {
  if (total_bytes(dst) != settings_.block_bytes) throw Error("internal: a KV block read into the wrong size");
  return queue_read(ReadJob{hash, position, std::vector<std::int32_t>(tokens.begin(), tokens.end()), std::move(dst), {}, nullptr, {}});
}

std::shared_ptr<const KvSpool::Read> KvSpool::read(ChainHash hash, std::uint64_t position, std::span<const std::int32_t> tokens,
                                                   BlockSink sink) {
  if (!sink) throw Error("internal: a KV block read into nowhere");
  return queue_read(ReadJob{hash, position, std::vector<std::int32_t>(tokens.begin(), tokens.end()), {}, std::move(sink), nullptr, {}});
}

std::shared_ptr<const KvSpool::Read> KvSpool::queue_read(ReadJob job) {
  auto result = std::make_shared<Read>();
  std::unique_lock lock(mutex_);
  if (!enabled_ || stopping_) {
    result->done.store(true, std::memory_order_release);
    return result;
  }
  job.result = result;
  job.queued = std::chrono::steady_clock::now();
  reads_.push_back(std::move(job));
  lock.unlock();
  work_.notify_all();
  return result;
}

void KvSpool::set_on_read_done(std::function<void()> f) {
  std::lock_guard lock(mutex_);
  on_read_done_ = std::move(f);
}

void KvSpool::reader_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || !reads_.empty(); });
    if (stopping_) return;
    ReadJob job = std::move(reads_.front());
    reads_.pop_front();
    lock.unlock();
    const bool ok = read_file(job);
    job.result->ok = ok;
    job.result->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - job.queued).count();
    job.result->done.store(true, std::memory_order_release);
    lock.lock();
    // Outside the lock: the callback takes the engine's lock, which is held when it asks for stats.
    if (std::function<void()> done = on_read_done_) {
      lock.unlock();
      done();
      lock.lock();
    }
  }
}

bool KvSpool::flush(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  return written_.wait_until(lock, deadline, [&] { return !enabled_ || (writes_.empty() && !writing_); }) && enabled_;
}

SpoolStats KvSpool::stats() const {
  std::lock_guard lock(mutex_);
  SpoolStats s = counters_;
  s.enabled = enabled_;
  s.blocks = index_.size();
  s.bytes = bytes_;
  s.write_queue_bytes = queued_bytes_;
  return s;
}

bool spool_block(KvSpool& spool, const KvCache& cache, int block, ChainHash hash, ChainHash parent, std::uint64_t position,
                 std::span<const std::int32_t> tokens, bool wait_for_room) {
  if (spool.contains(hash)) return true;  // before any copy of the block's bytes
  if (KvCache::DeviceState* device = cache.device_state()) {
    std::shared_ptr<PendingBlock> pending = device->save_block(block);
    if (!pending) {
      spool.count_dropped_write();
      return false;
    }
    return spool.write(hash, parent, position, tokens, std::move(pending), wait_for_room);
  }
  if (!cache.pool().has_local(block)) return false;
  return spool.write(hash, parent, position, tokens, cache.pool().block_parts(block), wait_for_room);
}

std::shared_ptr<const KvSpool::Read> read_spooled_block(KvSpool& spool, KvCache& cache, int block, ChainHash hash, std::uint64_t position,
                                                        std::span<const std::int32_t> tokens, bool skip_missing) {
  if (KvCache::DeviceState* device = cache.device_state()) return spool.read(hash, position, tokens, device->load_block(block));
  return spool.read(hash, position, tokens, cache.pool().block_parts(block, skip_missing));
}

}  // namespace promptly
