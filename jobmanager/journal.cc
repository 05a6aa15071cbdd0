#include "jobmanager/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <utility>
#include <vector>

namespace copse::jm {
namespace {
constexpr const char* kFileName = "journal.jsonl";

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
  const uint64_t size = ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  uint64_t lines = 0;
  if (std::ifstream in{path, std::ios::binary}) {
    std::vector<char> chunk(1 << 16);
    while (in.read(chunk.data(), static_cast<std::streamsize>(chunk.size())) || in.gcount() > 0) {
      lines += static_cast<uint64_t>(std::count(chunk.begin(), chunk.begin() + in.gcount(), '\n'));
    }
  }
  return std::unique_ptr<Journal>(new Journal(dir, fd, fsync, size, lines));
}

Journal::~Journal() {
  (void)Flush();
  ::close(fd_);
}

void Journal::Record(const Json& record) {
  buffer_ += DumpJson(record);
  buffer_ += '\n';
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

Status Journal::Rewrite(const std::vector<Json>& records) {
  std::string text;
  for (const Json& r : records) {
    text += DumpJson(r);
    text += '\n';
  }
  const auto path = dir_ / kFileName;
  const auto tmp = dir_ / (std::string(kFileName) + ".tmp");
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return Status::IOError("cannot create " + tmp.string() + ": " + std::strerror(errno));
  // Always synced, whatever fsync_ says: renaming an unsynced file over the journal could
  // leave a machine crash with neither.
  Status st = WriteAll(fd, text, tmp.string());
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
  bytes_ = text.size();
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

namespace {

/// The largest job id below kMaxJournalJobId in `lines[from..]`, found as the text `"job":N`
/// (what a record's dump writes) among a line's top-level keys, whether or not the line parses
/// (the job document a `job` record carries may have keys named "job" of its own): 0 when none.
uint64_t LargestJobIdNamed(const std::vector<std::string>& lines, size_t from) {
  static constexpr std::string_view kKey = "\"job\":";
  uint64_t largest = 0;
  for (size_t n = from; n < lines.size(); ++n) {
    const std::string& l = lines[n];
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < l.size(); ++i) {
      const char c = l[i];
      if (in_string) {
        if (c == '\\')
          ++i;
        else if (c == '"')
          in_string = false;
        continue;
      }
      if (c == '{' || c == '[') ++depth;
      if (c == '}' || c == ']') --depth;
      if (c != '"') continue;
      in_string = true;
      if (depth != 1 || l.compare(i, kKey.size(), kKey) != 0) continue;
      uint64_t id = 0;
      for (size_t p = i + kKey.size(); p < l.size() && l[p] >= '0' && l[p] <= '9' && id < kMaxJournalJobId; ++p) {
        id = id * 10 + static_cast<uint64_t>(l[p] - '0');
      }
      if (id < kMaxJournalJobId) largest = std::max(largest, id);
    }
  }
  return largest;
}

}  // namespace

Result<std::vector<Json>> Journal::Replay(const std::filesystem::path& dir, std::vector<std::string>* warnings,
                                          bool* records_lost) {
  if (records_lost) *records_lost = false;
  std::vector<Json> records;
  auto path = dir / kFileName;
  std::ifstream in(path);
  if (!in) return records;  // a first start
  std::string line;
  size_t number = 0;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(std::move(line));
  for (const auto& l : lines) {
    ++number;
    if (l.empty()) continue;
    auto parsed = ParseJson(l, path.string() + " line " + std::to_string(number));
    if (!parsed.ok() || !parsed->is_object() || !parsed->contains("t")) {
      const bool last = number == lines.size();
      std::string what =
          last ? "torn last record (a crash mid-write) dropped" : "malformed record; the rest of the journal is ignored";
      if (warnings) warnings->push_back(path.string() + ":" + std::to_string(number) + ": " + what);
      if (records_lost && !last) *records_lost = true;
      // (A torn last record was never acknowledged: the client of a torn submission heard no id.)
      if (uint64_t named = last ? 0 : LargestJobIdNamed(lines, number - 1); named > 0) {
        records.push_back({{"t", "ids"}, {"job", named}});
        if (warnings) {
          warnings->push_back(path.string() + ": job ids up to " + std::to_string(named) +
                              " appear from there on and will not be handed out again");
        }
      }
      break;
    }
    records.push_back(std::move(*parsed));
  }
  return records;
}

}  // namespace copse::jm
