#include "jobmanager/trace_streamer.h"

#include <chrono>

#include "common/thread_name.h"
#include "common/wire.h"

namespace copse::jm {

TraceStreamer::TraceStreamer() : thread_([this] { Loop(); }) {}

TraceStreamer::~TraceStreamer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

bool TraceStreamer::Accepts(const std::shared_ptr<net::FramedConnection>& conn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.size() >= kMaxQueued) return false;
  for (const auto& [waiting, snapshot] : queue_) {
    if (waiting.lock() == conn) return false;
  }
  return true;
}

void TraceStreamer::Send(std::shared_ptr<net::FramedConnection> conn, TraceSnapshot snapshot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(conn, std::move(snapshot));
  }
  cv_.notify_one();
}

void TraceStreamer::Loop() {
  SetThreadName("jm-trace");
  while (true) {
    std::pair<std::weak_ptr<net::FramedConnection>, TraceSnapshot> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    if (auto conn = work.first.lock()) Stream(*conn, work.second);
  }
}

void TraceStreamer::Stream(net::FramedConnection& conn, const TraceSnapshot& snapshot) {
  bool sent_all = true;
  FormatTraceEvents(snapshot, kEventsPerPart, [&](std::string_view part) {
    auto stalled_at = std::chrono::steady_clock::now();
    size_t backlog = SIZE_MAX;
    while (conn.open() && conn.queued_bytes() > kMaxBacklogBytes) {
      if (const size_t now_queued = conn.queued_bytes(); now_queued < backlog) {
        backlog = now_queued;  // it reads: the wait starts again
        stalled_at = std::chrono::steady_clock::now();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) break;
      }
      if (std::chrono::steady_clock::now() - stalled_at > kStallLimit) {
        conn.CloseFromAnyThread(Status::Timeout("took none of its trace for " + std::to_string(kStallLimit.count()) + " s"));
        return sent_all = false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!conn.open() || stopping_) return sent_all = false;
    std::string body = R"({"op":"trace_part","events":[)";
    body.append(part);
    body += "]}";
    conn.SendRaw(wire::EncodeFrame(wire::FrameType::kJson, body));
    return true;
  });
  if (!sent_all) return;
  Json end = TraceTrailer(snapshot);
  end["op"] = "trace";
  conn.Send(end);
}

}  // namespace copse::jm
