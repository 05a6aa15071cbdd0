#pragma once
// Helpers shared by the channel tests: scratch directories, message patterns, drain loops.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <doctest/doctest.h>

#include "channels/channel.h"
#include "channels/output_store.h"

namespace copse::chan::testing {

/// A fresh directory under the system temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> n{0};
    path_ =
        std::filesystem::temp_directory_path() / ("copse-chan-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// Message i of a deterministic pattern: `size` bytes derived from (seed, i).
inline std::string Pattern(size_t size, uint64_t seed, uint64_t i) {
  std::string s(size, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + i + 1;
  for (size_t k = 0; k < size; ++k) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s[k] = static_cast<char>(x);
  }
  return s;
}

/// Reads to the end; fails the test on an error.
inline std::vector<std::string> Drain(ChannelReader& r) {
  std::vector<std::string> out;
  for (;;) {
    auto m = r.Next();
    REQUIRE_MESSAGE(m.ok(), m.status().ToString());
    if (!m->has_value()) return out;
    out.emplace_back((*m)->view());
  }
}

/// Reads until an error or the end; returns the status (OK at the end).
inline Status DrainStatus(ChannelReader& r) {
  for (;;) {
    auto m = r.Next();
    if (!m.ok()) return m.status();
    if (!m->has_value()) return Status::OK();
  }
}

/// A message carrying `payload` (an object, not bytes).
inline Buffer PayloadMessage(std::shared_ptr<const Payload> payload) { return Buffer(std::move(payload)); }

/// Writes `messages` as the memory output `key` of `store`, with a durable copy at
/// `durable_copy` when one is named.
inline void WriteMemoryOutput(OutputStore& store, const OutputKey& key, const std::vector<Buffer>& messages,
                              const std::filesystem::path& durable_copy = {}) {
  auto w = store.CreateWriter(key, StorageKind::kMemory, durable_copy);
  REQUIRE(w.ok());
  for (const Buffer& m : messages) REQUIRE((*w)->Write(m).ok());
  REQUIRE((*w)->Close().ok());
}

/// A payload whose encoding is `text`, counting how often it was encoded.
class CountingPayload final : public Payload {
 public:
  explicit CountingPayload(std::string text) : text_(std::move(text)) {}
  size_t EncodedSize() const override { return text_.size(); }
  std::string Encode() const override {
    ++encodes;
    return text_;
  }
  mutable std::atomic<int> encodes{0};

 private:
  std::string text_;
};

/// A payload that offers its encoding in place as `spans` (their concatenation), counting how
/// often it was encoded instead.
class SpannedPayload final : public Payload {
 public:
  explicit SpannedPayload(std::vector<std::string> spans) : spans_(std::move(spans)) {
    for (const auto& s : spans_) size_ += s.size();
  }
  size_t EncodedSize() const override { return size_; }
  std::string Encode() const override {
    ++encodes;
    return Joined();
  }
  std::vector<std::string_view> Spans() const override { return {spans_.begin(), spans_.end()}; }
  std::string Joined() const {
    std::string all;
    for (const auto& s : spans_) all += s;
    return all;
  }
  mutable std::atomic<int> encodes{0};

 private:
  std::vector<std::string> spans_;
  size_t size_ = 0;
};

}  // namespace copse::chan::testing
