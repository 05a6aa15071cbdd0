#include "vertex/input_prefetcher.h"

#include "vertex/protocol_types.h"

#include <algorithm>
#include <utility>

#include "channels/memory_queue.h"
#include "channels/remote_reader.h"
#include "common/logging.h"
#include "common/thread_name.h"

namespace copse::vertex {

std::unique_ptr<chan::ChannelReader> PrefetchedInputs::Take(size_t port) {
  std::unique_lock lock(mu_);
  if (port >= slots_.size()) return nullptr;
  Slot& slot = slots_[port];
  settled_.wait(lock, [&] { return slot.state != State::kFetching; });
  if (slot.state != State::kArrived) return nullptr;
  auto log = std::make_shared<chan::MessageLog>();
  log->messages = std::move(slot.messages);
  log->closed = true;
  slot.state = State::kNone;
  return std::make_unique<chan::MessageLogReader>(std::move(log));
}

void PrefetchedInputs::Settle(size_t port, State state, std::vector<chan::Buffer> messages) {
  {
    std::lock_guard lock(mu_);
    slots_[port].state = state;
    slots_[port].messages = std::move(messages);
  }
  settled_.notify_all();
}

InputPrefetcher::~InputPrefetcher() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    pending_.clear();
    threads.swap(threads_);
  }
  work_.notify_all();
  for (auto& t : threads) t.join();
}

void InputPrefetcher::WorkerLoop() {
  SetThreadName("copse-prefetch");
  std::unique_lock lock(mu_);
  while (true) {
    ++idle_;
    work_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    --idle_;
    if (stopping_) return;
    auto job = std::move(pending_.front());
    pending_.pop_front();
    lock.unlock();
    job();
    lock.lock();
  }
}

namespace {

struct PlannedFetch {
  size_t port;
  chan::OutputKey key;
  std::string host;
  uint16_t data_port;
  bool from_after;
};

}  // namespace

std::shared_ptr<PrefetchedInputs> InputPrefetcher::Start(const google::protobuf::RepeatedPtrField<protocol::Input>& inputs,
                                                         std::optional<After> after, std::shared_ptr<std::atomic<bool>> cancel,
                                                         std::function<void(const Status&)> on_after) {
  // What to fetch: every stored input of another daemon; those that exist already first.
  std::vector<PlannedFetch> plan;
  for (size_t port = 0; port < static_cast<size_t>(inputs.size()); ++port) {
    const protocol::Input& in = inputs[static_cast<int>(port)];
    // Stored on another daemon whose store serves it (checked by the codec: host and port set).
    if (!in.has_stored() || !in.stored().has_store() || in.stored().store().local()) continue;
    const chan::OutputKey key = FromProtocol(in.stored().key());
    const bool from_after = after && key.vertex == after->vertex && key.version == after->version;
    plan.push_back({port, key, in.stored().store().host(), static_cast<uint16_t>(in.stored().store().port()), from_after});
  }
  if (plan.empty()) return nullptr;
  std::stable_partition(plan.begin(), plan.end(), [](const PlannedFetch& f) { return !f.from_after; });
  auto prefetched = std::make_shared<PrefetchedInputs>(inputs.size());
  for (const auto& f : plan) prefetched->slots_[f.port].state = PrefetchedInputs::State::kFetching;

  auto job = [this, plan = std::move(plan), after, cancel, on_after = std::move(on_after), prefetched] {
    Status after_status = Status::OK();
    bool any_from_after = false;
    for (const auto& f : plan) {
      Status st;
      try {
        st = FetchOne(f.host, f.data_port, f.key, f.from_after, *cancel, *prefetched, f.port);
      } catch (const std::exception& e) {
        // A peer's bytes must not end the daemon: this thread has no one above it to catch.
        prefetched->Settle(f.port, PrefetchedInputs::State::kNotKept);
        st = Status::DataLoss("fetching " + f.key.ToString() + " from " + f.host + ":" + std::to_string(f.data_port) + ": " +
                              e.what());
      }
      any_from_after = any_from_after || f.from_after;
      if (f.from_after && after_status.ok()) after_status = st;
    }
    if (after && !any_from_after) {
      after_status = Status::FailedPrecondition("none of its inputs comes from the attempt it is chained after");
    }
    if (after) on_after(after_status);
  };
  {
    std::lock_guard lock(mu_);
    pending_.push_back(std::move(job));
    if (idle_ < pending_.size()) threads_.emplace_back([this] { WorkerLoop(); });
  }
  work_.notify_one();
  return prefetched;
}

Status InputPrefetcher::FetchOne(const std::string& host, uint16_t port, const chan::OutputKey& key, bool from_after,
                                 const std::atomic<bool>& cancel, PrefetchedInputs& into, size_t slot) const {
  using State = PrefetchedInputs::State;
  chan::RemoteReaderOptions options;
  options.tls = tls_;
  if (from_after) options.wait_ms = kWaitSliceMs;
  while (true) {
    if (cancel.load() || stopping_.load()) {
      into.Settle(slot, State::kNotKept);
      return Status::Cancelled("the task was cancelled");
    }
    auto reader = chan::OpenRemoteReader(host, port, key, secret_, options);
    if (!reader.ok()) {
      if (from_after && reader.status().code() == StatusCode::kTimeout) continue;  // not produced yet
      into.Settle(slot, State::kNotKept);
      return reader.status();
    }
    std::vector<chan::Buffer> messages;
    uint64_t bytes = 0;
    while (true) {
      auto m = (*reader)->Next();
      if (!m.ok()) {
        into.Settle(slot, State::kNotKept);
        return m.status();
      }
      if (!m->has_value()) break;
      bytes += (*m)->size();
      if (bytes > kMaxPrefetchBytes) {
        into.Settle(slot, State::kNotKept);  // it exists: the task streams it when it runs
        return Status::OK();
      }
      messages.push_back(std::move(**m));
    }
    into.Settle(slot, State::kArrived, std::move(messages));
    return Status::OK();
  }
}

}  // namespace copse::vertex
