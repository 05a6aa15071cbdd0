#pragma once
// In-memory channel ends over a plain vector of buffers: the simplest complete channel, used
// by the daemon for vertices whose output is read back in the same process and by tests.
// Not thread-safe: the writer must have closed before a reader starts.
#include <memory>
#include <vector>

#include "channels/channel.h"

namespace copse::chan {

/// The messages of one channel, complete once `closed`.
struct MessageLog {
  std::vector<Buffer> messages;
  bool closed = false;
  size_t bytes = 0;
};

class MessageLogWriter final : public ChannelWriter {
 public:
  explicit MessageLogWriter(std::shared_ptr<MessageLog> log) : log_(std::move(log)) {}
  Status Write(Buffer message) override {
    if (log_->closed) return Status::FailedPrecondition("write after close");
    log_->bytes += message.size();
    log_->messages.push_back(std::move(message));
    return Status::OK();
  }
  Status Close() override {
    log_->closed = true;
    return Status::OK();
  }

 private:
  std::shared_ptr<MessageLog> log_;
};

/// Reads a closed log from the start; buffers are shared, not copied.
class MessageLogReader final : public ChannelReader {
 public:
  explicit MessageLogReader(std::shared_ptr<const MessageLog> log) : log_(std::move(log)) {}
  Result<std::optional<Buffer>> Next() override {
    if (next_ < log_->messages.size()) return std::optional<Buffer>(log_->messages[next_++]);
    if (!log_->closed) return Status::Unavailable("read past the end of an unclosed channel");
    return std::optional<Buffer>();
  }

 private:
  std::shared_ptr<const MessageLog> log_;
  size_t next_ = 0;
};

}  // namespace copse::chan
