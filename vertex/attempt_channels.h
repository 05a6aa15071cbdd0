#pragma once
// What the daemon puts around an attempt's channels: counting what it wrote (the job manager
// learns output sizes for locality), remembering which input failed (so a failed attempt says
// which input was lost), one output port fanned out to several live channels, and an input
// known to be empty. Each is used by one attempt's thread.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "channels/channel.h"

namespace copse::vertex {

/// Remembers the first read error of an input so a failed attempt can say which input was lost.
class TrackingReader final : public chan::ChannelReader {
 public:
  TrackingReader(std::unique_ptr<chan::ChannelReader> inner, int port, int* lost_port)
      : inner_(std::move(inner)), port_(port), lost_port_(lost_port) {}
  Result<std::optional<chan::Buffer>> Next() override {
    auto r = inner_->Next();
    if (!r.ok() && *lost_port_ < 0 && r.status().code() != StatusCode::kCancelled) *lost_port_ = port_;
    return r;
  }

 private:
  std::unique_ptr<chan::ChannelReader> inner_;
  int port_;
  int* lost_port_;
};

/// Counts what a vertex wrote, so the job manager learns output sizes for locality.
class CountingWriter final : public chan::ChannelWriter {
 public:
  explicit CountingWriter(std::unique_ptr<chan::ChannelWriter> inner) : inner_(std::move(inner)) {}
  Status Write(chan::Buffer message) override {
    bytes_ += message.size();
    ++messages_;
    return inner_->Write(std::move(message));
  }
  Status Close() override {
    if (closed_) return Status::OK();
    closed_ = true;
    return inner_->Close();
  }
  bool closed() const { return closed_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t messages() const { return messages_; }

 private:
  std::unique_ptr<chan::ChannelWriter> inner_;
  uint64_t bytes_ = 0;
  uint64_t messages_ = 0;
  bool closed_ = false;
};

/// One output port read by several live channels (a broadcast): every message to each.
class TeeWriter final : public chan::ChannelWriter {
 public:
  explicit TeeWriter(std::vector<std::unique_ptr<chan::ChannelWriter>> outs) : outs_(std::move(outs)) {}
  Status Write(chan::Buffer message) override {
    for (auto& o : outs_) COPSE_RETURN_NOT_OK(o->Write(message));
    return Status::OK();
  }
  Status Close() override {
    for (auto& o : outs_) COPSE_RETURN_NOT_OK(o->Close());
    return Status::OK();
  }

 private:
  std::vector<std::unique_ptr<chan::ChannelWriter>> outs_;
};

/// An input the job manager knows to be empty: end of stream at once, no fetch.
class EmptyReader final : public chan::ChannelReader {
 public:
  Result<std::optional<chan::Buffer>> Next() override { return std::optional<chan::Buffer>(); }
};

}  // namespace copse::vertex
