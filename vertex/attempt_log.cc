#include "vertex/attempt_log.h"

#include <algorithm>

namespace copse::vertex {
namespace {
constexpr size_t kTailChunk = 16 << 10;
}  // namespace

void AttemptLog::AppendTo(std::vector<Chunk>& chunks, std::string_view stream, std::string_view text) {
  if (!chunks.empty() && chunks.back().stream == stream) {
    chunks.back().text.append(text);
  } else {
    chunks.push_back({std::string(stream), std::string(text)});
  }
}

void AttemptLog::Append(std::string_view stream, std::string_view text) {
  if (text.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  written_ += text.size();
  if (head_used_ < kHeadBytes) {
    const size_t n = std::min(text.size(), kHeadBytes - head_used_);
    AppendTo(pending_, stream, text.substr(0, n));
    head_used_ += n;
    text.remove_prefix(n);
    if (text.empty()) return;
  }
  if (!past_head_) {  // the first byte beyond the head, whether or not a write straddled it
    past_head_ = true;
    const bool mid_line = !pending_.empty() && !pending_.back().text.empty() && pending_.back().text.back() != '\n';
    AppendTo(pending_, kNoteStream,
             std::string(mid_line ? "\n" : "") + "[copse: this attempt's log passed " + std::to_string(kHeadBytes >> 10) +
                 " KiB; its last " + std::to_string(kTailBytes >> 10) + " KiB follow when it ends]\n");
  }
  // The tail is kept in chunks of at most kTailChunk bytes, so that trimming its front drops
  // whole chunks and moves at most one chunk's bytes, however much is written.
  while (!text.empty()) {
    if (tail_.empty() || tail_.back().stream != stream || tail_.back().text.size() >= kTailChunk) {
      tail_.push_back({std::string(stream), std::string()});
    }
    std::string& back = tail_.back().text;
    const size_t n = std::min(text.size(), kTailChunk - back.size());
    back.append(text.substr(0, n));
    text.remove_prefix(n);
    tail_bytes_ += n;
  }
  while (tail_bytes_ - tail_.front().text.size() >= kTailBytes) {
    tail_bytes_ -= tail_.front().text.size();
    omitted_ += tail_.front().text.size();
    tail_.pop_front();
  }
  if (tail_bytes_ > kTailBytes) {
    const size_t drop = tail_bytes_ - kTailBytes;
    tail_.front().text.erase(0, drop);
    tail_bytes_ -= drop;
    omitted_ += drop;
  }
}

std::vector<AttemptLog::Chunk> AttemptLog::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Chunk> out = std::move(pending_);
  pending_.clear();
  if (finished_) {
    if (omitted_ > 0) {
      // On a line of its own: the tail starts wherever the bytes left out ended.
      AppendTo(out, kNoteStream, "[copse: " + std::to_string(omitted_) + " bytes left out here]\n");
      omitted_ = 0;
    }
    for (auto& c : tail_) AppendTo(out, c.stream, c.text);
    tail_.clear();
    tail_bytes_ = 0;
  }
  return out;
}

bool AttemptLog::HasPending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !pending_.empty() || (finished_ && (omitted_ > 0 || !tail_.empty()));
}

void AttemptLog::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  finished_ = true;
}

uint64_t AttemptLog::bytes_written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return written_;
}

}  // namespace copse::vertex
