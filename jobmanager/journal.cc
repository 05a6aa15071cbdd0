#include "jobmanager/journal.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <optional>
#include <utility>
#include <vector>

#include "common/json_util.h"
#include "protocol/checks.h"
#include "protocol/codec.h"

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

/// What the whole records in `data[from..]` hold, found by their markers: after damage, the
/// frames that follow it.
struct Following {
  size_t records = 0;
  uint64_t largest_job = 0;  // the largest job id they name (0: none)
  uint32_t restarts = 0;     // the largest restart count they hold
};

Following WholeRecordsFrom(std::string_view data, size_t from) {
  static constexpr char kMarkerBytes[4] = {static_cast<char>(kMarker & 0xff), static_cast<char>((kMarker >> 8) & 0xff),
                                           static_cast<char>((kMarker >> 16) & 0xff), static_cast<char>(kMarker >> 24)};
  Following out;
  for (size_t at = data.find(std::string_view(kMarkerBytes, 4), from); at != std::string_view::npos;
       at = data.find(std::string_view(kMarkerBytes, 4), at + 1)) {
    const auto body = WholeFrameAt(data, at);
    protocol::JournalRecord record;
    if (!body || !record.ParseFromArray(body->data(), static_cast<int>(body->size()))) continue;
    ++out.records;
    if (const uint64_t id = protocol::JobNamed(record); id <= protocol::kLargestJobId)
      out.largest_job = std::max(out.largest_job, id);
    if (record.has_restart()) out.restarts = std::max(out.restarts, record.restart().restarts());
    at += kFrameHeaderBytes + body->size() - 1;
  }
  return out;
}

/// Whether the frame at `data[at..]` runs past the end of the data: what a write cut short by
/// a crash leaves (a frame whose length fits but whose body is wrong is damage, not a tear).
bool RunsPastTheEnd(std::string_view data, size_t at) {
  const size_t left = data.size() - at;
  for (size_t i = 0; i < 4 && i < left; ++i) {
    if (static_cast<unsigned char>(data[at + i]) != ((kMarker >> (8 * i)) & 0xff)) return false;
  }
  return left < kFrameHeaderBytes || GetLE(data.data() + at + 4, 4) > left - kFrameHeaderBytes;
}

/// Where the whole frames that follow the header end (the header's end when there are none).
size_t EndOfWholeFrames(std::string_view data, uint64_t* records) {
  size_t at = kHeader.size();
  for (std::optional<std::string_view> body; (body = WholeFrameAt(data, at)); ++*records) {
    at += kFrameHeaderBytes + body->size();
  }
  return at;
}

/// The journal file's contents (nullopt: there is none).
Result<std::optional<std::string>> ReadJournal(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) return std::optional<std::string>();
  COPSE_ASSIGN_OR_RETURN(std::string data, ReadFile(path.string()));
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
  // Appends follow the last whole frame: a torn or damaged tail (which the replay before this
  // reported, and kept a copy of) goes, or records appended after it would be dropped with it
  // at the next start. A file without the header becomes an empty journal.
  COPSE_ASSIGN_OR_RETURN(const std::optional<std::string> data, ReadJournal(path));
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return Status::IOError("cannot open journal " + path.string() + ": " + std::strerror(errno));
  uint64_t records = 0;
  const bool headed = data && data->compare(0, kHeader.size(), kHeader) == 0;
  const uint64_t whole = headed ? EndOfWholeFrames(*data, &records) : 0;
  uint64_t size = whole;
  if (!headed || whole != data->size()) {
    Status cut = ::ftruncate(fd, static_cast<off_t>(whole)) == 0
                     ? Status::OK()
                     : Status::IOError("cannot truncate " + path.string() + ": " + std::strerror(errno));
    if (cut.ok() && !headed) cut = WriteAll(fd, std::string(kHeader), "journal"), size = kHeader.size();
    if (!cut.ok()) {
      ::close(fd);
      return cut;
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
  if (Status st = WriteAll(fd_, buffer_, "journal"); !st.ok()) {
    // Part of it may be written (a full disk): cut it off, or records appended after the torn
    // frame would be dropped with it at the next start. The records stay buffered for the
    // next flush.
    if (::ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) {
      return Status::IOError(st.message() + "; and the partial write could not be cut off: " + std::strerror(errno));
    }
    return st;
  }
  bytes_ += buffer_.size();
  records_ += std::exchange(buffered_, 0);
  buffer_.clear();
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
  } else if (WholeRecordsFrom(data, 0).records == 0) {
    // Neither the header nor a record: not a journal at all (a file put in its place).
    return Status::FailedPrecondition(path.string() + " is not a copse journal (it does not start \"" +
                                      std::string(kHeader.substr(0, kHeader.size() - 1)) +
                                      "\" and holds no record): move it aside to start without it");
  }
  // (Records without the header: damage from the first byte, read as a damaged first record.)
  for (size_t number = 1; at < data.size(); ++number) {
    const auto body = at == 0 ? std::nullopt : WholeFrameAt(data, at);
    protocol::JournalRecord record;
    if (body && record.ParseFromArray(body->data(), static_cast<int>(body->size()))) {
      records.push_back(std::move(record));
      at += kFrameHeaderBytes + body->size();
      continue;
    }
    // Torn (a write cut short by a crash, nothing whole after it: the client of a torn
    // submission heard no id) or damaged (a wrong body, or whole records after it, which
    // cannot be trusted to apply).
    const Following after = WholeRecordsFrom(data, at + 1);
    const std::string where = "record " + std::to_string(number) + " (byte " + std::to_string(at) + "): ";
    if (at > 0 && after.records == 0 && RunsPastTheEnd(data, at)) {
      warn(where + "torn last record (a crash mid-write) dropped");
      break;
    }
    warn(where + (at == 0 ? "not a copse journal header" : "damaged record") + "; the rest of the journal (" +
         std::to_string(after.records) + " whole records) is ignored");
    if (records_lost) *records_lost = true;
    if (after.largest_job > 0) {
      records.emplace_back().mutable_ids()->set_up_to(after.largest_job);
      warn("job ids up to " + std::to_string(after.largest_job) + " appear from there on and will not be handed out again");
    }
    // Attempt versions the lives after the damage handed out stay taken too.
    if (after.restarts > 0) records.emplace_back().mutable_restart()->set_restarts(after.restarts);
    break;
  }
  return records;
}

}  // namespace copse::jm
