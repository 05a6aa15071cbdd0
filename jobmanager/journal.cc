#include "jobmanager/journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace copse::jm {
namespace {
constexpr const char* kFileName = "journal.jsonl";
}

Result<std::unique_ptr<Journal>> Journal::Open(const std::filesystem::path& dir, bool fsync) {
  auto path = dir / kFileName;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return Status::IOError("cannot open journal " + path.string() + ": " + std::strerror(errno));
  return std::unique_ptr<Journal>(new Journal(fd, fsync));
}

Journal::~Journal() {
  (void)Flush();
  ::close(fd_);
}

void Journal::Record(const Json& record) {
  buffer_ += record.dump();
  buffer_ += '\n';
}

Status Journal::Flush() {
  size_t off = 0;
  while (off < buffer_.size()) {
    ssize_t n = ::write(fd_, buffer_.data() + off, buffer_.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IOError(std::string("journal write failed: ") + std::strerror(errno));
    }
    off += static_cast<size_t>(n);
  }
  buffer_.clear();
  if (fsync_ && off > 0 && ::fdatasync(fd_) != 0) return Status::IOError("journal fdatasync failed");
  return Status::OK();
}

Result<std::vector<Json>> Journal::Replay(const std::filesystem::path& dir, std::vector<std::string>* warnings) {
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
      std::string what = number == lines.size() ? "torn last record (a crash mid-write) dropped"
                                                : "malformed record; the rest of the journal is ignored";
      if (warnings) warnings->push_back(path.string() + ":" + std::to_string(number) + ": " + what);
      break;
    }
    records.push_back(std::move(*parsed));
  }
  return records;
}

}  // namespace copse::jm
