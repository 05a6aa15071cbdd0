#include "jobmanager/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <optional>
#include <utility>
#include <vector>

#include "protocol/checks.h"

namespace copse::jm {
namespace {

/// The format's first line; a journal of another version names its own there.
constexpr std::string_view kHeaderPrefix = "copse journal ";
constexpr std::string_view kHeader = "copse journal 1\n";
/// What the JSON-lines journal of copse before this format was called.
constexpr const char* kJsonLinesFileName = "journal.jsonl";

/// Each record's frame: marker, body length, XXH3-64 of the body (little-endian).
constexpr uint32_t kMarker = 0x1A5E0BC7;
constexpr size_t kFrameHeaderBytes = 16;
/// A record larger than this is damage (a job document is the largest; the control port
/// refuses anything near it).
constexpr uint32_t kMaxRecordBytes = 1u << 30;

void PutU32(char* at, uint32_t v) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<char>(v >> (8 * i));
}
void PutU64(char* at, uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<char>(v >> (8 * i));
}
uint64_t GetLE(const char* at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(at[i])} << (8 * i);
  return v;
}

/// Appends `record`, framed, to `out`.
void AppendFrame(const protocol::JournalRecord& record, std::string& out) {
  const size_t size = record.ByteSizeLong();
  const size_t at = out.size();
  out.resize(at + kFrameHeaderBytes + size);
  char* frame = out.data() + at;
  record.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(frame + kFrameHeaderBytes));
  PutU32(frame, kMarker);
  PutU32(frame + 4, static_cast<uint32_t>(size));
  PutU64(frame + 8, XXH3_64bits(frame + kFrameHeaderBytes, size));
}

/// The frame at `data[at..]`: its body when whole (marker, length within the data, checksum),
/// nullopt otherwise.
std::optional<std::string_view> WholeFrameAt(std::string_view data, size_t at) {
  if (data.size() - at < kFrameHeaderBytes || GetLE(data.data() + at, 4) != kMarker) return std::nullopt;
  const uint64_t size = GetLE(data.data() + at + 4, 4);
  if (size > kMaxRecordBytes || size > data.size() - at - kFrameHeaderBytes) return std::nullopt;
  std::string_view body = data.substr(at + kFrameHeaderBytes, size);
  if (XXH3_64bits(body.data(), body.size()) != GetLE(data.data() + at + 8, 8)) return std::nullopt;
  return body;
}

/// The job id a record names (0: none).
uint64_t JobIdOf(const protocol::JournalRecord& r) {
  switch (r.body_case()) {
    case protocol::JournalRecord::kJob: return r.job().job();
    case protocol::JournalRecord::kDone: return r.done().job();
    case protocol::JournalRecord::kRegen: return r.regen().job();
    case protocol::JournalRecord::kEnd: return r.end().job();
    case protocol::JournalRecord::kIds: return r.ids().up_to();
    default: return 0;
  }
}

/// The whole records in `data[from..]`, found by their marker: after damage, the frames that
/// follow it. Returns how many there are and the largest job id they name (0: none).
std::pair<size_t, uint64_t> WholeRecordsFrom(std::string_view data, size_t from) {
  static constexpr char kMarkerBytes[4] = {static_cast<char>(kMarker & 0xff), static_cast<char>((kMarker >> 8) & 0xff),
                                           static_cast<char>((kMarker >> 16) & 0xff), static_cast<char>(kMarker >> 24)};
  size_t count = 0;
  uint64_t largest = 0;
  for (size_t at = data.find(std::string_view(kMarkerBytes, 4), from); at != std::string_view::npos;
       at = data.find(std::string_view(kMarkerBytes, 4), at + 1)) {
    const auto body = WholeFrameAt(data, at);
    protocol::JournalRecord record;
    if (!body || !record.ParseFromArray(body->data(), static_cast<int>(body->size()))) continue;
    ++count;
    if (const uint64_t id = JobIdOf(record); id <= protocol::kLargestJobId) largest = std::max(largest, id);
    at += kFrameHeaderBytes + body->size() - 1;
  }
  return {count, largest};
}

/// The journal file's contents (nullopt: there is none).
Result<std::optional<std::string>> ReadJournal(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!std::filesystem::exists(path)) return std::optional<std::string>();
    return Status::IOError("cannot read " + path.string() + ": " + std::strerror(errno));
  }
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::IOError("cannot read " + path.string() + ": " + std::strerror(errno));
  return std::optional<std::string>(std::move(data));
}

Status WriteAll(int fd, const std::string& data, const std::string& what) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IOError(what + " write failed: " + std::strerror(errno));
    }
    off += static_cast<size_t>(n);
  }
  return Status::OK();
}

/// Makes a rename in `dir` survive a machine crash.
Status SyncDirectory(const std::filesystem::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::IOError("cannot open " + dir.string() + ": " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Status::IOError("cannot sync " + dir.string() + ": " + std::strerror(errno));
  return Status::OK();
}
}  // namespace

Result<std::unique_ptr<Journal>> Journal::Open(const std::filesystem::path& dir, bool fsync) {
  auto path = dir / kFileName;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return Status::IOError("cannot open journal " + path.string() + ": " + std::strerror(errno));
  struct stat st {};
  uint64_t size = ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  if (size < kHeader.size()) {  // new, or its header torn by a crash (Replay read nothing)
    Status written = ::ftruncate(fd, 0) == 0 ? WriteAll(fd, std::string(kHeader), "journal")
                                             : Status::IOError("cannot truncate " + path.string() + ": " + std::strerror(errno));
    if (!written.ok()) {
      ::close(fd);
      return written;
    }
    size = kHeader.size();
  }
  // Records are counted by walking their frames (the replay before this checked them).
  uint64_t records = 0;
  auto data = ReadJournal(path);
  if (data.ok() && *data) {
    for (size_t at = kHeader.size(); at + kFrameHeaderBytes <= (*data)->size(); ++records) {
      at += kFrameHeaderBytes + GetLE((*data)->data() + at + 4, 4);
    }
  }
  return std::unique_ptr<Journal>(new Journal(dir, fd, fsync, size, records));
}

Journal::~Journal() {
  (void)Flush();
  ::close(fd_);
}

void Journal::Record(const protocol::JournalRecord& record) {
  AppendFrame(record, buffer_);
  ++buffered_;
}

Status Journal::Flush() {
  if (buffer_.empty()) return Status::OK();
  Status st = WriteAll(fd_, buffer_, "journal");
  bytes_ += buffer_.size();  // counted whole even after a failed write: it only paces compaction
  records_ += std::exchange(buffered_, 0);
  buffer_.clear();
  COPSE_RETURN_NOT_OK(st);
  if (fsync_ && ::fdatasync(fd_) != 0) return Status::IOError("journal fdatasync failed");
  return Status::OK();
}

Status Journal::Rewrite(const std::vector<protocol::JournalRecord>& records) {
  std::string data(kHeader);
  for (const auto& r : records) AppendFrame(r, data);
  const auto path = dir_ / kFileName;
  const auto tmp = dir_ / (std::string(kFileName) + ".tmp");
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return Status::IOError("cannot create " + tmp.string() + ": " + std::strerror(errno));
  // Always synced, whatever fsync_ says: renaming an unsynced file over the journal could
  // leave a machine crash with neither.
  Status st = WriteAll(fd, data, tmp.string());
  if (st.ok() && ::fdatasync(fd) != 0) st = Status::IOError("cannot sync " + tmp.string() + ": " + std::strerror(errno));
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = Status::IOError("cannot rename " + tmp.string() + ": " + std::strerror(errno));
  }
  if (!st.ok()) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return st;
  }
  ::close(fd_);
  fd_ = fd;  // opened O_APPEND: later records follow the snapshot
  bytes_ = data.size();
  records_ = records.size();
  buffered_ = 0;
  buffer_.clear();
  if (Status synced = SyncDirectory(dir_); !synced.ok()) {
    return Status::IOError("journal rewritten and in use, but a machine crash may bring back the old one: " + synced.message());
  }
  return Status::OK();
}

Result<std::filesystem::path> Journal::KeepDamagedCopy(const std::filesystem::path& dir) {
  const auto copy = dir / (std::string(kFileName) + ".damaged-" + std::to_string(::time(nullptr)));
  std::error_code ec;
  std::filesystem::copy_file(dir / kFileName, copy, std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) return Status::IOError("cannot keep a copy of the damaged journal as " + copy.string() + ": " + ec.message());
  return copy;
}

Result<std::vector<protocol::JournalRecord>> Journal::Replay(const std::filesystem::path& dir, std::vector<std::string>* warnings,
                                                             bool* records_lost) {
  if (records_lost) *records_lost = false;
  std::vector<protocol::JournalRecord> records;
  if (std::filesystem::exists(dir / kJsonLinesFileName)) {
    return Status::FailedPrecondition(
        (dir / kJsonLinesFileName).string() +
        " is the JSON-lines journal of a copse older than this one, which does not read it: "
        "finish its jobs with the copse that wrote it, or move the file aside to start without them");
  }
  const auto path = dir / kFileName;
  COPSE_ASSIGN_OR_RETURN(const std::optional<std::string> read, ReadJournal(path));
  if (!read) return records;  // a first start
  const std::string_view data = *read;
  auto warn = [&](const std::string& line) {
    if (warnings) warnings->push_back(path.string() + ": " + line);
  };
  // Another version's journal is refused whole: a replay that skipped it would forget its jobs.
  if (data.substr(0, kHeaderPrefix.size()) == kHeaderPrefix && data.substr(0, kHeader.size()) != kHeader &&
      data.size() >= kHeader.size()) {
    const std::string_view line = data.substr(0, std::min<size_t>(data.find('\n'), 40));
    return Status::FailedPrecondition(path.string() + " starts \"" + std::string(line) + "\", a format this copse (\"" +
                                      std::string(kHeader.substr(0, kHeader.size() - 1)) +
                                      "\") does not read: start the copse that wrote it, or move the file aside to start "
                                      "without its jobs");
  }
  size_t at = 0;
  if (data.substr(0, kHeader.size()) == kHeader) {
    at = kHeader.size();
  } else if (kHeader.substr(0, data.size()) == data) {
    return records;  // created, and the header torn: nothing was journaled
  }
  // (No header at all: damage from the first byte, read as a damaged first record below.)
  for (size_t number = 1; at < data.size(); ++number) {
    const auto body = at == 0 ? std::nullopt : WholeFrameAt(data, at);
    protocol::JournalRecord record;
    if (body && record.ParseFromArray(body->data(), static_cast<int>(body->size()))) {
      records.push_back(std::move(record));
      at += kFrameHeaderBytes + body->size();
      continue;
    }
    // Torn (a crash mid-write: nothing whole follows, and the client of a torn submission
    // heard no id) or damaged (whole records follow, which cannot be trusted to apply).
    const auto [following, named] = WholeRecordsFrom(data, at + 1);
    const std::string where = "record " + std::to_string(number) + " (byte " + std::to_string(at) + "): ";
    if (following == 0) {
      warn(where + "torn last record (a crash mid-write) dropped");
      break;
    }
    warn(where + (at == 0 ? "not a copse journal header" : "damaged record") + "; the rest of the journal (" +
         std::to_string(following) + " whole records) is ignored");
    if (records_lost) *records_lost = true;
    if (named > 0) {
      protocol::JournalRecord ids;
      ids.mutable_ids()->set_up_to(named);
      records.push_back(std::move(ids));
      warn("job ids up to " + std::to_string(named) + " appear from there on and will not be handed out again");
    }
    break;
  }
  return records;
}

}  // namespace copse::jm
