#include "channels/output_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <climits>
#include <fstream>
#include <cstring>
#include <limits>

#include "channels/iovec_util.h"
#include "channels/record_format.h"
#include "common/logging.h"

namespace copse::chan {

namespace fs = std::filesystem;
using internal::Checksum;
using internal::kRecordHeaderBytes;

namespace {

constexpr size_t kFileBufferBytes = 1 << 20;
constexpr size_t kMinFileBufferBytes = 4 << 10;
constexpr size_t kDirectWriteBytes = 256 << 10;  // messages at least this big skip the buffer

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

Status WriteVFully(int fd, iovec* iov, int count, const std::string& what) {
  while (count > 0) {
    ssize_t w = ::writev(fd, iov, std::min(count, IOV_MAX));
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::IOError(Errno("writing " + what));
    }
    AdvanceIovec(iov, count, static_cast<size_t>(w));
  }
  return Status::OK();
}

Status WriteFully(int fd, const char* p, size_t n, const std::string& what) {
  iovec iov{const_cast<char*>(p), n};
  return WriteVFully(fd, &iov, 1, what);
}

Result<uint64_t> GetUnsigned(const Json& j, const char* name, uint64_t max) {
  auto it = j.find(name);
  if (it == j.end()) return Status::InvalidArgument(std::string("output key: missing /") + name);
  if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0)) {
    return Status::InvalidArgument(std::string("output key: /") + name + " must be an unsigned integer, not " +
                                   JsonTypeName(*it));
  }
  auto v = it->get<uint64_t>();
  if (v > max) return Status::InvalidArgument(std::string("output key: /") + name + " is out of range");
  return v;
}

}  // namespace

// ---- OutputKey -------------------------------------------------------------------------------

std::string OutputKey::ToString() const {
  return "job" + std::to_string(job) + "/v" + std::to_string(vertex) + ".v" + std::to_string(version) + "/p" +
         std::to_string(port);
}

Json OutputKey::ToJson() const { return Json{{"job", job}, {"vertex", vertex}, {"version", version}, {"port", port}}; }

Result<OutputKey> OutputKey::FromJson(const Json& j) {
  if (!j.is_object()) return Status::InvalidArgument("output key must be an object, not " + JsonTypeName(j));
  constexpr uint64_t k32 = std::numeric_limits<uint32_t>::max();
  OutputKey k;
  COPSE_ASSIGN_OR_RETURN(k.job, GetUnsigned(j, "job", std::numeric_limits<uint64_t>::max()));
  COPSE_ASSIGN_OR_RETURN(uint64_t vertex, GetUnsigned(j, "vertex", k32));
  COPSE_ASSIGN_OR_RETURN(uint64_t version, GetUnsigned(j, "version", k32));
  COPSE_ASSIGN_OR_RETURN(uint64_t port, GetUnsigned(j, "port", k32));
  k.vertex = static_cast<uint32_t>(vertex);
  k.version = static_cast<uint32_t>(version);
  k.port = static_cast<uint32_t>(port);
  return k;
}

// ---- entries ---------------------------------------------------------------------------------

struct OutputStore::Entry {
  OutputInfo info;
  std::shared_ptr<const StoredMessages> memory;  // in-memory outputs
  fs::path file;                                 // file outputs with at least one message
  bool damaged = false;
};

// ---- the file writer (file outputs, and memory outputs once spilled) -------------------------

/// Appends records to a temp file, created at the first message; Finish() renames it. The file
/// is a fresh one in the store's job directory, or `at` (a durable copy) when given.
class FileSink {
 public:
  FileSink(OutputStore* store, OutputKey key, fs::path at = {}) : store_(store), key_(key), at_(std::move(at)) {}
  ~FileSink() { Abort(); }

  Status Append(const Buffer& m, uint64_t checksum) {
    if (m.size() > std::numeric_limits<uint32_t>::max()) {
      return Status::InvalidArgument("message of " + std::to_string(m.size()) + " bytes exceeds the 4 GiB limit");
    }
    if (fd_ < 0) COPSE_RETURN_NOT_OK(OpenFile());
    char header[kRecordHeaderBytes];
    internal::EncodeRecordHeader(header, static_cast<uint32_t>(m.size()), checksum);
    const std::vector<std::string_view> spans = m.spans();  // a payload's bytes in place
    if (m.size() >= kDirectWriteBytes) {
      COPSE_RETURN_NOT_OK(Flush());
      std::vector<iovec> iov{{header, sizeof header}};
      for (std::string_view p : spans) iov.push_back({const_cast<char*>(p.data()), p.size()});
      COPSE_RETURN_NOT_OK(WriteVFully(fd_, iov.data(), static_cast<int>(iov.size()), tmp_.string()));
    } else {
      if (buf_.size() + sizeof header + m.size() > kFileBufferBytes) COPSE_RETURN_NOT_OK(Flush());
      buf_.append(header, sizeof header);
      for (std::string_view p : spans) buf_.append(p);
    }
    bytes_ += m.size();
    ++messages_;
    return Status::OK();
  }

  /// Flushes and closes the file; the caller publishes `final_path()` (empty: no messages).
  Status Finish() {
    if (fd_ < 0) return Status::OK();
    COPSE_RETURN_NOT_OK(Flush());
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return Status::IOError(Errno("closing " + tmp_.string()));
    std::error_code ec;
    fs::rename(tmp_, final_, ec);
    if (ec) return Status::IOError("renaming " + tmp_.string() + ": " + ec.message());
    tmp_.clear();
    return Status::OK();
  }

  /// Deletes the temp file of an unfinished output.
  void Abort() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!tmp_.empty()) {
      std::error_code ec;
      fs::remove(tmp_, ec);
      tmp_.clear();
    }
  }

  const fs::path& final_path() const { return final_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t messages() const { return messages_; }

 private:
  Status OpenFile();
  Status Flush() {
    if (buf_.empty()) return Status::OK();
    Status st = WriteFully(fd_, buf_.data(), buf_.size(), tmp_.string());
    buf_.clear();
    return st;
  }

  OutputStore* store_;
  OutputKey key_;
  fs::path at_;
  int fd_ = -1;
  fs::path tmp_, final_;
  std::string buf_;
  uint64_t bytes_ = 0, messages_ = 0;
};

Status FileSink::OpenFile() {
  if (at_.empty()) {
    COPSE_ASSIGN_OR_RETURN(final_, store_->NewFilePath(key_));
  } else {
    std::error_code ec;
    fs::create_directories(at_.parent_path(), ec);
    if (ec) return Status::IOError("cannot create " + at_.parent_path().string() + ": " + ec.message());
    final_ = at_;
  }
  tmp_ = final_;
  tmp_ += ".tmp";
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);  // outputs are the job's data, no one else's
  if (fd_ < 0) {
    tmp_.clear();
    return Status::IOError(Errno("creating " + final_.string() + ".tmp"));
  }
  buf_.reserve(kFileBufferBytes);
  buf_.append(internal::kFileMagic, sizeof internal::kFileMagic);
  return Status::OK();
}

class OutputStore::FileWriter final : public ChannelWriter {
 public:
  FileWriter(OutputStore* store, OutputKey key) : store_(store), key_(key), sink_(store, key) {}
  Status Write(Buffer message) override {
    if (closed_) return Status::FailedPrecondition("write after close on " + key_.ToString());
    return sink_.Append(message, Checksum(message.spans()));
  }
  Status Close() override {
    if (closed_) return Status::FailedPrecondition("output " + key_.ToString() + " closed twice");
    closed_ = true;
    COPSE_RETURN_NOT_OK(sink_.Finish());
    auto e = std::make_shared<Entry>();
    e->info = OutputInfo{sink_.bytes(), sink_.messages(), StorageKind::kFile, false};
    e->file = sink_.final_path();
    Status st = store_->Publish(key_, e);
    if (!st.ok() && !e->file.empty()) {
      std::error_code ec;
      fs::remove(e->file, ec);
    }
    return st;
  }

 private:
  OutputStore* store_;
  OutputKey key_;
  FileSink sink_;
  bool closed_ = false;
};

// ---- the memory writer -----------------------------------------------------------------------

uint64_t StoredMessages::ChecksumOf(size_t i) const {
  return messages[i].payload() ? Checksum(messages[i].spans()) : checksums[i];
}

class OutputStore::MemoryWriter final : public ChannelWriter {
 public:
  MemoryWriter(OutputStore* store, OutputKey key, fs::path durable_copy)
      : store_(store), key_(key), stored_(std::make_shared<StoredMessages>()) {
    if (!durable_copy.empty()) durable_ = std::make_unique<FileSink>(store, key, std::move(durable_copy));
  }
  ~MemoryWriter() override { store_->Release(reserved_); }

  Status Write(Buffer message) override {
    if (closed_) return Status::FailedPrecondition("write after close on " + key_.ToString());
    // Hashed once, for every copy. A payload stays an object in memory: hashed only if its
    // bytes are made (a durable copy, a spill, ChecksumOf).
    const bool hashed = durable_ || !message.payload();
    const uint64_t checksum = hashed ? Checksum(message.spans()) : 0;
    if (durable_) COPSE_RETURN_NOT_OK(durable_->Append(message, checksum));
    if (!sink_ && store_->TryReserve(message.size())) {
      reserved_ += message.size();
      stored_->bytes += message.size();
      stored_->messages.push_back(std::move(message));
      stored_->checksums.push_back(checksum);
      return Status::OK();
    }
    if (!sink_) COPSE_RETURN_NOT_OK(Spill());
    return sink_->Append(message, hashed ? checksum : Checksum(message.spans()));
  }

  Status Close() override {
    if (closed_) return Status::FailedPrecondition("output " + key_.ToString() + " closed twice");
    closed_ = true;
    if (durable_) COPSE_RETURN_NOT_OK(durable_->Finish());  // in place before anyone hears of it
    auto e = std::make_shared<Entry>();
    if (sink_) {
      COPSE_RETURN_NOT_OK(sink_->Finish());
      e->info = OutputInfo{sink_->bytes(), sink_->messages(), StorageKind::kMemory, false};
      e->file = sink_->final_path();
    } else {
      e->info = OutputInfo{stored_->bytes, stored_->messages.size(), StorageKind::kMemory, true};
      e->memory = std::move(stored_);
    }
    Status st = store_->Publish(key_, e);
    if (st.ok()) {
      reserved_ = 0;  // the entry owns the reservation now
    } else if (!e->file.empty()) {
      std::error_code ec;
      fs::remove(e->file, ec);
    }
    return st;
  }

 private:
  /// Moves what is held so far into a file and continues there.
  Status Spill() {
    Logger("chan")->debug("memory output {} spills to disk after {} bytes (budget {} bytes, {} held)", key_.ToString(),
                          stored_->bytes, store_->memory_budget_bytes(), store_->memory_bytes());
    store_->spills_.fetch_add(1, std::memory_order_relaxed);
    store_->spilled_bytes_.fetch_add(stored_->bytes, std::memory_order_relaxed);
    sink_ = std::make_unique<FileSink>(store_, key_);
    for (size_t i = 0; i < stored_->messages.size(); ++i) {
      COPSE_RETURN_NOT_OK(sink_->Append(stored_->messages[i], stored_->ChecksumOf(i)));
    }
    stored_ = std::make_shared<StoredMessages>();
    store_->Release(reserved_);
    reserved_ = 0;
    return Status::OK();
  }

  OutputStore* store_;
  OutputKey key_;
  std::shared_ptr<StoredMessages> stored_;
  std::unique_ptr<FileSink> sink_;     // set once spilled
  std::unique_ptr<FileSink> durable_;  // the durable copy, when asked for
  uint64_t reserved_ = 0;
  bool closed_ = false;
};

// ---- readers ---------------------------------------------------------------------------------

namespace {

class MemoryReader final : public ChannelReader {
 public:
  MemoryReader(std::shared_ptr<const StoredMessages> stored, std::string what, bool verify)
      : stored_(std::move(stored)), what_(std::move(what)), verify_(verify) {}
  Result<std::optional<Buffer>> Next() override {
    if (next_ >= stored_->messages.size()) return std::optional<Buffer>();
    const Buffer& m = stored_->messages[next_];
    if (verify_ && !m.payload() && Checksum(m.view()) != stored_->checksums[next_]) {
      return Status::DataLoss("output " + what_ + ": message " + std::to_string(next_) + " failed its checksum (memory)");
    }
    ++next_;
    return std::optional<Buffer>(m);
  }

 private:
  std::shared_ptr<const StoredMessages> stored_;
  std::string what_;
  bool verify_;
  size_t next_ = 0;
};

class EmptyReader final : public ChannelReader {
 public:
  Result<std::optional<Buffer>> Next() override { return std::optional<Buffer>(); }
};

class FileReader final : public ChannelReader {
 public:
  explicit FileReader(std::unique_ptr<FileRecordReader> r) : r_(std::move(r)) {}
  Result<std::optional<Buffer>> Next() override {
    COPSE_ASSIGN_OR_RETURN(auto rec, r_->Next());
    if (!rec) return std::optional<Buffer>();
    return std::optional<Buffer>(std::move(rec->bytes));
  }

 private:
  std::unique_ptr<FileRecordReader> r_;
};

}  // namespace

Result<std::unique_ptr<FileRecordReader>> FileRecordReader::Open(const fs::path& file, std::string what, bool verify) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status::DataLoss("output " + what + ": cannot open " + file.string() + ": " + std::strerror(errno));
  }
  auto r = Open(fd, what, verify);
  if (!r.ok()) return Status::DataLoss(r.status().message() + " (" + file.string() + ")");
  return r;
}

Result<std::unique_ptr<FileRecordReader>> FileRecordReader::Open(int fd, std::string what, bool verify) {
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  // A buffer the file fits in, within [4 KiB, 1 MiB]: a file whose size is not known (or that
  // grows) only reads in more turns.
  size_t buffer_bytes = kFileBufferBytes;
  uint64_t file_bytes = 0;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    buffer_bytes = std::clamp<size_t>(static_cast<size_t>(st.st_size), kMinFileBufferBytes, kFileBufferBytes);
    file_bytes = static_cast<uint64_t>(st.st_size);
  }
  std::unique_ptr<FileRecordReader> r(new FileRecordReader(fd, std::move(what), verify, buffer_bytes));
  r->file_bytes_ = file_bytes;
  COPSE_RETURN_NOT_OK(r->Fill(sizeof internal::kFileMagic));
  if (r->end_ - r->begin_ < sizeof internal::kFileMagic ||
      std::memcmp(r->buf_.data() + r->begin_, internal::kFileMagic, sizeof internal::kFileMagic) != 0) {
    return Status::DataLoss("output " + r->what_ + ": not a copse output file");
  }
  r->begin_ += sizeof internal::kFileMagic;
  return r;
}

FileRecordReader::FileRecordReader(int fd, std::string what, bool verify, size_t buffer_bytes)
    : fd_(fd), what_(std::move(what)), verify_(verify), buf_(buffer_bytes) {}

FileRecordReader::~FileRecordReader() { ::close(fd_); }

/// Makes at least `need` bytes available in buf_[begin_, end_) unless the file ends first.
Status FileRecordReader::Fill(size_t need) {
  if (end_ - begin_ >= need || eof_) return Status::OK();
  std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
  end_ -= begin_;
  begin_ = 0;
  while (end_ < need && !eof_) {
    ssize_t n = ::read(fd_, buf_.data() + end_, buf_.size() - end_);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::DataLoss("output " + what_ + ": " + Errno("reading"));
    }
    if (n == 0) eof_ = true;
    end_ += static_cast<size_t>(n);
    read_bytes_ += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

Result<std::optional<Record>> FileRecordReader::Next() {
  COPSE_RETURN_NOT_OK(Fill(kRecordHeaderBytes));
  if (end_ == begin_) return std::optional<Record>();
  auto truncated = [&] {
    return Status::DataLoss("output " + what_ + ": file is truncated in message " + std::to_string(index_));
  };
  if (end_ - begin_ < kRecordHeaderBytes) return truncated();
  const uint32_t len = internal::GetU32(buf_.data() + begin_);
  Record rec;
  rec.checksum = internal::GetU64(buf_.data() + begin_ + 4);
  begin_ += kRecordHeaderBytes;
  // A length past the file's end (a damaged file, or one a peer handed over) is refused before
  // its storage is allocated: up to 4 GiB for a few bytes.
  if (file_bytes_ > 0 && len > file_bytes_ - (read_bytes_ - (end_ - begin_))) return truncated();
  std::string bytes;
  if (len <= buf_.size() / 4) {
    COPSE_RETURN_NOT_OK(Fill(len));
    if (end_ - begin_ < len) return truncated();
    bytes.assign(buf_.data() + begin_, len);
    begin_ += len;
  } else {
    // Large message: take what is buffered, read the rest straight into its storage.
    bytes = internal::UninitializedString(len);
    size_t have = std::min<size_t>(end_ - begin_, len);
    std::memcpy(bytes.data(), buf_.data() + begin_, have);
    begin_ += have;
    while (have < len) {
      ssize_t n = ::read(fd_, bytes.data() + have, len - have);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::DataLoss("output " + what_ + ": " + Errno("reading"));
      }
      if (n == 0) return truncated();
      have += static_cast<size_t>(n);
    }
  }
  if (verify_ && Checksum(bytes) != rec.checksum) {
    return Status::DataLoss("output " + what_ + ": message " + std::to_string(index_) + " failed its checksum (file)");
  }
  ++index_;
  rec.bytes = Buffer(std::move(bytes));
  return std::optional<Record>(std::move(rec));
}

// ---- the store -------------------------------------------------------------------------------

OutputStore::OutputStore(fs::path dir, uint64_t budget) : dir_(std::move(dir)), memory_budget_(budget) {}

OutputStore::~OutputStore() = default;

Result<std::unique_ptr<OutputStore>> OutputStore::Make(fs::path dir, uint64_t memory_budget_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create output directory " + dir.string() + ": " + ec.message());
  // Jobs' outputs are served to daemons that hold the cluster secret, never read by other users
  // of this host: the directory is this user's alone (files made by earlier versions included).
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  if (ec) return Status::IOError("cannot make output directory " + dir.string() + " private: " + ec.message());
  std::unique_ptr<OutputStore> store(new OutputStore(std::move(dir), memory_budget_bytes));
  store->AdoptEarlierOutputs();
  store->PruneDamaged();
  return store;
}

namespace {

/// Parses the decimal number at the start of `s` (advancing it); false when there is none.
bool TakeNumber(std::string_view& s, uint64_t& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec != std::errc() || end == s.data()) return false;
  s.remove_prefix(static_cast<size_t>(end - s.data()));
  return true;
}

bool TakeLiteral(std::string_view& s, std::string_view literal) {
  if (s.substr(0, literal.size()) != literal) return false;
  s.remove_prefix(literal.size());
  return true;
}

/// The key and file id of an output file's name, "v<V>.<version>.p<P>.<id>.out" (NewFilePath).
std::optional<std::pair<OutputKey, uint64_t>> ParseOutputFileName(uint64_t job, std::string_view name) {
  uint64_t vertex = 0, version = 0, port = 0, id = 0;
  constexpr uint64_t k32 = std::numeric_limits<uint32_t>::max();
  if (!TakeLiteral(name, "v") || !TakeNumber(name, vertex) || !TakeLiteral(name, ".") || !TakeNumber(name, version) ||
      !TakeLiteral(name, ".p") || !TakeNumber(name, port) || !TakeLiteral(name, ".") || !TakeNumber(name, id) || name != ".out" ||
      vertex > k32 || version > k32 || port > k32) {
    return std::nullopt;
  }
  return std::pair{OutputKey{job, static_cast<uint32_t>(vertex), static_cast<uint32_t>(version), static_cast<uint32_t>(port)},
                   id};
}

/// Walks the record headers of an output file: its messages and payload bytes when the file is
/// a magic followed by whole records and nothing else; else what is wrong with it, and where.
/// Checksums are not verified here (every read verifies them).
Result<std::pair<uint64_t, uint64_t>> CountRecords(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(std::string("cannot open it: ") + std::strerror(errno));
  struct stat st {};
  Status wrong = Status::DataLoss("it is no longer than the file magic");
  uint64_t messages = 0, bytes = 0;
  if (::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) > sizeof internal::kFileMagic) {
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    std::vector<char> window(64 << 10);  // headers are read a window at a time, payloads skipped
    uint64_t window_at = 0, window_len = 0, at = sizeof internal::kFileMagic;
    auto fill = [&](uint64_t offset) {
      const ssize_t n = ::pread(fd, window.data(), window.size(), static_cast<off_t>(offset));
      window_at = offset;
      window_len = n > 0 ? static_cast<uint64_t>(n) : 0;
    };
    fill(0);
    if (window_len < sizeof internal::kFileMagic ||
        std::memcmp(window.data(), internal::kFileMagic, sizeof internal::kFileMagic) != 0) {
      wrong = Status::DataLoss("it does not start with the output file magic");
    } else {
      wrong = Status::OK();
      while (at < size) {
        if (at + kRecordHeaderBytes > window_at + window_len) fill(at);
        if (at + kRecordHeaderBytes > window_at + window_len) {
          wrong = Status::DataLoss(fmt::format("record {} at byte {} has {} bytes of its {}-byte header", messages + 1, at,
                                               size - at, kRecordHeaderBytes));
          break;
        }
        const uint64_t length = internal::GetU32(window.data() + (at - window_at));
        if (at + kRecordHeaderBytes + length > size) {
          wrong = Status::DataLoss(
              fmt::format("record {} at byte {} says {} bytes, past the file's end at {}", messages + 1, at, length, size));
          break;
        }
        at += kRecordHeaderBytes + length;
        ++messages;
        bytes += length;
      }
    }
  }
  ::close(fd);
  if (!wrong.ok()) return wrong;
  return std::pair{messages, bytes};
}

}  // namespace

void OutputStore::AdoptEarlierOutputs() {
  std::error_code ec;
  size_t adopted = 0, removed = 0, damaged = 0;
  uint64_t next_id = 0;
  // Files are renamed into place without fsync: after a process crash the page cache has them
  // whole, after a machine crash they may be cut short at a record boundary and still parse.
  // Only outputs written since this boot are adopted (the kernel's boot id, kept beside them).
  std::string boot, recorded;
  std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), boot);
  std::getline(std::ifstream(dir_ / "boot_id"), recorded);
  const bool same_boot = !boot.empty() && boot == recorded;
  std::ofstream(dir_ / "boot_id", std::ios::trunc) << boot << "\n";
  for (const auto& job_dir : fs::directory_iterator(dir_, ec)) {
    const std::string job_name = job_dir.path().filename().string();
    std::string_view digits = job_name;
    uint64_t job = 0;
    if (!job_dir.is_directory() || !TakeLiteral(digits, "job") || !TakeNumber(digits, job) || !digits.empty()) continue;
    if (!same_boot) {
      std::error_code rm_ec;
      removed += fs::remove_all(job_dir.path(), rm_ec) > 0;
      continue;
    }
    std::error_code dir_ec;
    for (const auto& f : fs::directory_iterator(job_dir.path(), dir_ec)) {
      const auto parsed = ParseOutputFileName(job, f.path().filename().string());
      if (!parsed || !f.is_regular_file() || entries_.count(parsed->first)) {  // temporary, foreign or a second copy
        std::error_code rm_ec;
        fs::remove_all(f.path(), rm_ec);
        ++removed;
        continue;
      }
      const auto counted = CountRecords(f.path());
      if (!counted.ok()) {  // not served (a read would fail), but kept for a person to look at
        // Names recur (job ids start again with a new job manager state): never over another.
        fs::path aside = dir_ / kDamagedDir / job_name / f.path().filename();
        for (int n = 1; fs::exists(aside); ++n) {
          aside = dir_ / kDamagedDir / job_name / (f.path().filename().string() + "." + std::to_string(n));
        }
        std::error_code mv_ec;
        fs::create_directories(aside.parent_path(), mv_ec);
        if (!mv_ec) fs::rename(f.path(), aside, mv_ec);
        if (mv_ec) fs::remove(f.path(), mv_ec);
        // Kept kDamagedKeepDays from now (PruneDamaged), however old the file was.
        std::error_code touch_ec;
        if (!mv_ec) fs::last_write_time(aside, fs::file_time_type::clock::now(), touch_ec);
        Logger("chan")->warn("output store {}: {} is damaged ({}); {}", dir_.string(), f.path().string(),
                             counted.status().message(), mv_ec ? "removed" : "moved to " + aside.string());
        ++damaged;
        continue;
      }
      auto e = std::make_shared<Entry>();
      e->info = OutputInfo{counted->second, counted->first, StorageKind::kFile, false};
      e->file = f.path();
      entries_.emplace(parsed->first, std::move(e));
      next_id = std::max(next_id, parsed->second + 1);
      ++adopted;
    }
  }
  next_file_id_ = next_id;
  if (adopted + removed + damaged > 0) {
    Logger("chan")->info(
        "output store {}: kept {} file outputs of an earlier process, set {} damaged ones aside, "
        "removed {} other entries{}",
        dir_.string(), adopted, damaged, removed, same_boot ? "" : " (written before the last boot)");
  }
}

void OutputStore::PruneDamaged() {
  struct Aside {
    fs::file_time_type written;
    uint64_t bytes;
    fs::path path;
  };
  std::vector<Aside> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir_ / kDamagedDir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code f_ec;
    if (!it->is_regular_file(f_ec)) continue;
    const auto written = it->last_write_time(f_ec);
    const uint64_t bytes = it->file_size(f_ec);
    if (!f_ec) files.push_back({written, bytes, it->path()});
  }
  std::sort(files.begin(), files.end(), [](const Aside& a, const Aside& b) { return a.written > b.written; });  // newest first
  const auto cutoff = fs::file_time_type::clock::now() - std::chrono::hours(24 * kDamagedKeepDays);
  uint64_t kept = 0;
  size_t removed = 0;
  for (const Aside& f : files) {
    if (f.written >= cutoff && kept + f.bytes <= kDamagedMaxBytes) {
      kept += f.bytes;
      continue;
    }
    std::error_code rm_ec;
    removed += fs::remove(f.path, rm_ec);
  }
  if (removed > 0) {
    Logger("chan")->info("output store {}: removed {} damaged files set aside more than {} days ago or beyond {} MiB",
                         dir_.string(), removed, kDamagedKeepDays, kDamagedMaxBytes >> 20);
  }
  // Job folders left empty go too.
  for (fs::directory_iterator it(dir_ / kDamagedDir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e_ec;
    if (it->is_directory(e_ec) && fs::is_empty(it->path(), e_ec)) fs::remove(it->path(), e_ec);
  }
}

bool OutputStore::TryReserve(uint64_t bytes) {
  uint64_t cur = memory_bytes_.load(std::memory_order_relaxed);
  do {
    if (cur + bytes > memory_budget_) return false;
  } while (!memory_bytes_.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
  return true;
}

void OutputStore::Release(uint64_t bytes) {
  if (bytes) memory_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
}

fs::path OutputStore::JobDir(uint64_t job) const { return dir_ / ("job" + std::to_string(job)); }

Result<fs::path> OutputStore::NewFilePath(const OutputKey& key) {
  fs::path d = JobDir(key.job);
  std::error_code ec;
  fs::create_directories(d, ec);
  if (ec) return Status::IOError("cannot create " + d.string() + ": " + ec.message());
  // A store-wide counter in the name: a dropped output's file is deleted outside the lock, so a
  // rewrite of the same key must not reuse its name.
  return d / ("v" + std::to_string(key.vertex) + "." + std::to_string(key.version) + ".p" + std::to_string(key.port) + "." +
              std::to_string(next_file_id_.fetch_add(1)) + ".out");
}

Result<std::unique_ptr<ChannelWriter>> OutputStore::CreateWriter(const OutputKey& key, StorageKind kind, fs::path durable_copy) {
  if (Contains(key)) return Status::AlreadyExists("output " + key.ToString() + " already exists");
  if (!durable_copy.empty() && kind != StorageKind::kMemory) {
    return Status::InvalidArgument("output " + key.ToString() + ": only a memory output has a durable copy");
  }
  if (kind == StorageKind::kMemory) {
    return std::unique_ptr<ChannelWriter>(new MemoryWriter(this, key, std::move(durable_copy)));
  }
  return std::unique_ptr<ChannelWriter>(new FileWriter(this, key));
}

Status OutputStore::Publish(const OutputKey& key, std::shared_ptr<const Entry> entry) {
  std::lock_guard lock(mu_);
  auto [it, inserted] = entries_.emplace(key, std::move(entry));
  if (!inserted) return Status::AlreadyExists("output " + key.ToString() + " already exists");
  WakeWaitersOf(key);
  return Status::OK();
}

void OutputStore::WakeWaitersOf(const OutputKey& key) {
  if (auto it = waiting_.find(key); it != waiting_.end()) it->second.cv.notify_all();
}

Result<OutputStore::Stored> OutputStore::Lookup(const OutputKey& key) const {
  std::shared_ptr<const Entry> e;
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return Status::NotFound("output " + key.ToString() + " is not stored here");
    e = it->second;
  }
  return Stored{key, e->info, e->memory, e->file, e->damaged};
}

Result<std::unique_ptr<ChannelReader>> OutputStore::OpenReader(const OutputKey& key) {
  COPSE_ASSIGN_OR_RETURN(Stored s, Lookup(key));
  if (s.damaged) return Status::DataLoss("output " + key.ToString() + " is damaged");
  if (s.memory) {
    return std::unique_ptr<ChannelReader>(new MemoryReader(std::move(s.memory), key.ToString(), verify_memory_reads_));
  }
  if (s.file.empty()) return std::unique_ptr<ChannelReader>(new EmptyReader());
  COPSE_ASSIGN_OR_RETURN(auto r, FileRecordReader::Open(s.file, key.ToString(), true));
  return std::unique_ptr<ChannelReader>(new FileReader(std::move(r)));
}

Result<std::unique_ptr<ChannelReader>> OutputStore::OpenDurableCopy(const fs::path& file, const OutputKey& key) {
  COPSE_ASSIGN_OR_RETURN(auto r, FileRecordReader::Open(file, key.ToString() + " (durable copy " + file.string() + ")", true));
  return std::unique_ptr<ChannelReader>(new FileReader(std::move(r)));
}

Result<std::unique_ptr<ChannelReader>> OutputStore::OpenOutputFile(int fd, std::string what) {
  // A pipe or socket would block the reader until its writer felt like answering.
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::DataLoss("output " + what + ": the descriptor is not a regular file");
  }
  COPSE_ASSIGN_OR_RETURN(auto r, FileRecordReader::Open(fd, std::move(what), true));
  return std::unique_ptr<ChannelReader>(new FileReader(std::move(r)));
}

namespace {

/// Reads `primary` and, should it fail, the durable copy from the same message on: the copy
/// holds the same messages, so skipping those already delivered resumes exactly.
class FallbackReader final : public ChannelReader {
 public:
  FallbackReader(std::unique_ptr<ChannelReader> primary, fs::path copy, OutputKey key)
      : current_(std::move(primary)), copy_(std::move(copy)), key_(key) {}
  Result<std::optional<Buffer>> Next() override {
    auto m = current_->Next();
    if (m.ok() || on_copy_) {
      if (m.ok() && *m) ++delivered_;
      return m;
    }
    on_copy_ = true;
    auto copy = OutputStore::OpenDurableCopy(copy_, key_);
    if (!copy.ok()) return Status(m.status().code(), m.status().message() + "; " + copy.status().message());
    current_ = std::move(*copy);
    for (uint64_t i = 0; i < delivered_; ++i) {
      COPSE_ASSIGN_OR_RETURN(auto skipped, current_->Next());
      if (!skipped) return Status::DataLoss("output " + key_.ToString() + ": its durable copy is shorter than the output");
    }
    return Next();
  }

 private:
  std::unique_ptr<ChannelReader> current_;
  fs::path copy_;
  OutputKey key_;
  uint64_t delivered_ = 0;
  bool on_copy_ = false;
};

}  // namespace

std::unique_ptr<ChannelReader> OutputStore::WithDurableFallback(std::unique_ptr<ChannelReader> primary, const fs::path& copy,
                                                                const OutputKey& key) {
  return std::make_unique<FallbackReader>(std::move(primary), copy, key);
}

Result<uint64_t> OutputStore::Size(const OutputKey& key) const {
  COPSE_ASSIGN_OR_RETURN(OutputInfo info, Info(key));
  return info.bytes;
}

Result<OutputInfo> OutputStore::Info(const OutputKey& key) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return Status::NotFound("output " + key.ToString() + " is not stored here");
  return it->second->info;
}

bool OutputStore::Contains(const OutputKey& key) const {
  std::lock_guard lock(mu_);
  return entries_.count(key) > 0;
}

bool OutputStore::WaitFor(const OutputKey& key, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  auto here = [&] { return entries_.count(key) > 0 || removed_.count(key) > 0; };
  if (here() || timeout.count() <= 0) return here();
  Waiters& waiters = waiting_[key];  // a map node: stays put while others come and go
  ++waiters.count;
  const bool arrived = waiters.cv.wait_for(lock, timeout, here);
  if (--waiters.count == 0) waiting_.erase(key);
  return arrived;
}

std::vector<OutputKey> OutputStore::List(std::optional<uint64_t> job) const {
  std::lock_guard lock(mu_);
  std::vector<OutputKey> out;
  auto it = job ? entries_.lower_bound(OutputKey{*job, 0, 0, 0}) : entries_.begin();
  for (; it != entries_.end() && (!job || it->first.job == *job); ++it) out.push_back(it->first);
  return out;
}

std::shared_ptr<const OutputStore::Entry> OutputStore::Unlink(const OutputKey& key) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  auto e = std::move(it->second);
  entries_.erase(it);
  return e;
}

void OutputStore::Forget(const std::shared_ptr<const Entry>& e) {
  if (!e) return;
  if (e->memory) Release(e->memory->bytes);
  if (!e->file.empty()) {
    std::error_code ec;
    fs::remove(e->file, ec);
  }
}

void OutputStore::Drop(const OutputKey& key) { Forget(Unlink(key)); }

void OutputStore::DropJob(uint64_t job) {
  std::vector<std::shared_ptr<const Entry>> dropped;
  {
    std::lock_guard lock(mu_);
    auto it = entries_.lower_bound(OutputKey{job, 0, 0, 0});
    while (it != entries_.end() && it->first.job == job) {
      dropped.push_back(std::move(it->second));
      it = entries_.erase(it);
    }
    removed_.erase(removed_.lower_bound(OutputKey{job, 0, 0, 0}), removed_.lower_bound(OutputKey{job + 1, 0, 0, 0}));
  }
  for (const auto& e : dropped) Forget(e);
  std::error_code ec;
  fs::remove(JobDir(job), ec);  // only when empty: a writer of the job may still be running
}

Status OutputStore::Remove(const OutputKey& key) {
  auto e = Unlink(key);
  if (!e) return Status::NotFound("output " + key.ToString() + " is not stored here");
  {
    std::lock_guard lock(mu_);
    removed_.insert(key);
    WakeWaitersOf(key);
  }
  Forget(e);
  Logger("chan")->info("fault injection: removed output {}", key.ToString());
  return Status::OK();
}

Status OutputStore::Corrupt(const OutputKey& key) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return Status::NotFound("output " + key.ToString() + " is not stored here");
  const Entry& old = *it->second;
  auto e = std::make_shared<Entry>(old);
  bool flipped = false;
  if (old.memory) {
    // Buffers are immutable and shared with readers: replace one by a damaged copy, keeping
    // the original checksum, in a new message list (open readers keep the old one).
    auto msgs = std::make_shared<StoredMessages>(*old.memory);
    for (size_t i = 0; i < msgs->messages.size(); ++i) {
      Buffer& m = msgs->messages[i];
      if (m.empty()) continue;
      msgs->checksums[i] = msgs->ChecksumOf(i);  // a payload becomes damaged bytes
      std::string bytes(m.view());
      bytes[bytes.size() / 2] = static_cast<char>(~bytes[bytes.size() / 2]);
      m = Buffer(std::move(bytes));
      flipped = true;
      break;
    }
    e->memory = std::move(msgs);
  } else if (!old.file.empty() && old.info.bytes > 0) {
    // Flip a byte of the first message with bytes: walk the record headers.
    int fd = ::open(old.file.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return Status::IOError(Errno("opening " + old.file.string()));
    off_t off = sizeof internal::kFileMagic;
    for (;;) {
      char h[kRecordHeaderBytes];
      if (::pread(fd, h, sizeof h, off) != static_cast<ssize_t>(sizeof h)) break;
      uint32_t len = internal::GetU32(h);
      if (len > 0) {
        char c;
        off_t at = off + static_cast<off_t>(kRecordHeaderBytes + len / 2);
        if (::pread(fd, &c, 1, at) == 1) {
          c = static_cast<char>(~c);
          flipped = ::pwrite(fd, &c, 1, at) == 1;
        }
        break;
      }
      off += static_cast<off_t>(kRecordHeaderBytes);
    }
    ::close(fd);
  }
  if (!flipped) e->damaged = true;  // nothing to flip: mark it
  it->second = std::move(e);
  Logger("chan")->info("fault injection: corrupted output {}", key.ToString());
  return Status::OK();
}

}  // namespace copse::chan
