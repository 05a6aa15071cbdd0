#include "channels/shm_registry.h"

#include <condition_variable>
#include <deque>
#include <map>

namespace copse::chan {

namespace {
using Clock = std::chrono::steady_clock;
// Longest sleep of a blocked end between looks at its cancel flag.
constexpr auto kCancelPoll = std::chrono::milliseconds(5);
// Without a cancel flag only DropJob (which notifies) and open_timeout end a wait.
constexpr auto kIdlePoll = std::chrono::milliseconds(100);

struct Fifo {
  StreamKey key;
  size_t window_bytes = 0, window_messages = 0;
  std::deque<Buffer> messages;
  size_t bytes = 0;
  bool writer_open = false, reader_open = false;  // an end exists now
  bool writer_seen = false, reader_seen = false;  // an end has ever existed
  bool closed = false;                            // end-of-stream written
  bool writer_died = false, reader_died = false;  // destroyed without finishing
  bool dropped = false;                           // DropJob / registry gone
  Clock::time_point created = Clock::now();
  std::condition_variable cv;  // any change
};
}  // namespace

struct ShmRegistry::Shared {
  mutable std::mutex mu;
  std::map<StreamKey, std::shared_ptr<Fifo>> fifos;
  size_t buffered = 0;

  // Forgets `f` once both ends have come and gone. A FIFO one end of which never opened is
  // kept (its data, or its failure, waits for that end) until DropJob. Caller holds mu.
  void MaybeForget(const std::shared_ptr<Fifo>& f) {
    if (f->writer_open || f->reader_open || !f->writer_seen || !f->reader_seen) return;
    buffered -= f->bytes;
    f->bytes = 0;
    f->messages.clear();
    auto it = fifos.find(f->key);
    if (it != fifos.end() && it->second == f) fifos.erase(it);
  }
};

namespace {

Status CancelledStatus(const StreamKey& key) { return Status::Cancelled("shm channel " + key.ToString() + " cancelled"); }

class ShmWriter final : public ChannelWriter {
 public:
  ShmWriter(std::shared_ptr<ShmRegistry::Shared> s, std::shared_ptr<Fifo> f, StreamOptions o)
      : s_(std::move(s)), f_(std::move(f)), o_(o) {}
  ~ShmWriter() override {
    std::lock_guard lock(s_->mu);
    if (!f_->closed) f_->writer_died = true;
    f_->writer_open = false;
    f_->cv.notify_all();
    s_->MaybeForget(f_);
  }

  Status Write(Buffer message) override {
    std::unique_lock lock(s_->mu);
    for (;;) {
      COPSE_RETURN_NOT_OK(Check());
      if (f_->closed) return Status::FailedPrecondition("write after close on shm channel " + f_->key.ToString());
      bool fits =
          f_->messages.empty() || (f_->messages.size() < f_->window_messages && f_->bytes + message.size() <= f_->window_bytes);
      if (fits) break;
      f_->cv.wait_for(lock, o_.cancel ? kCancelPoll : kIdlePoll);
    }
    f_->bytes += message.size();
    s_->buffered += message.size();
    f_->messages.push_back(std::move(message));
    f_->cv.notify_all();
    return Status::OK();
  }

  Status Close() override {
    std::lock_guard lock(s_->mu);
    if (f_->closed) return Status::OK();
    if (f_->dropped || (o_.cancel && o_.cancel->load())) return CancelledStatus(f_->key);
    if (f_->reader_died) return Status::Unavailable("the reader of shm channel " + f_->key.ToString() + " is gone");
    f_->closed = true;
    f_->cv.notify_all();
    return Status::OK();
  }

 private:
  // Caller holds mu.
  Status Check() {
    if (f_->dropped || (o_.cancel && o_.cancel->load())) return CancelledStatus(f_->key);
    if (f_->reader_died) return Status::Unavailable("the reader of shm channel " + f_->key.ToString() + " is gone");
    if (!f_->reader_seen && Clock::now() - f_->created > o_.open_timeout)
      return Status::Unavailable("no reader opened shm channel " + f_->key.ToString() + " in time");
    return Status::OK();
  }

  std::shared_ptr<ShmRegistry::Shared> s_;
  std::shared_ptr<Fifo> f_;
  StreamOptions o_;
};

class ShmReader final : public ChannelReader {
 public:
  ShmReader(std::shared_ptr<ShmRegistry::Shared> s, std::shared_ptr<Fifo> f, StreamOptions o)
      : s_(std::move(s)), f_(std::move(f)), o_(o) {}
  ~ShmReader() override {
    std::lock_guard lock(s_->mu);
    if (!eos_) f_->reader_died = true;
    f_->reader_open = false;
    s_->buffered -= f_->bytes;
    f_->bytes = 0;
    f_->messages.clear();
    f_->cv.notify_all();
    s_->MaybeForget(f_);
  }

  Result<std::optional<Buffer>> Next() override {
    std::unique_lock lock(s_->mu);
    for (;;) {
      if (f_->dropped || (o_.cancel && o_.cancel->load())) return CancelledStatus(f_->key);
      if (!f_->messages.empty()) {
        Buffer b = std::move(f_->messages.front());
        f_->messages.pop_front();
        f_->bytes -= b.size();
        s_->buffered -= b.size();
        f_->cv.notify_all();
        return std::optional<Buffer>(std::move(b));
      }
      if (f_->closed) {
        eos_ = true;
        return std::optional<Buffer>();
      }
      if (f_->writer_died)
        return Status::Unavailable("the writer of shm channel " + f_->key.ToString() + " failed before end-of-stream");
      if (!f_->writer_seen && Clock::now() - f_->created > o_.open_timeout)
        return Status::Unavailable("no writer opened shm channel " + f_->key.ToString() + " in time");
      f_->cv.wait_for(lock, o_.cancel ? kCancelPoll : kIdlePoll);
    }
  }

 private:
  std::shared_ptr<ShmRegistry::Shared> s_;
  std::shared_ptr<Fifo> f_;
  StreamOptions o_;
  bool eos_ = false;
};

}  // namespace

ShmRegistry::ShmRegistry() : shared_(std::make_shared<Shared>()) {}

ShmRegistry::~ShmRegistry() {
  std::lock_guard lock(shared_->mu);
  for (auto& [k, f] : shared_->fifos) {
    f->dropped = true;
    f->cv.notify_all();
  }
  shared_->fifos.clear();
}

namespace {
std::shared_ptr<Fifo> GetOrCreate(ShmRegistry::Shared& s, const StreamKey& key, const StreamOptions& o) {
  auto& f = s.fifos[key];
  if (!f) {
    f = std::make_shared<Fifo>();
    f->key = key;
    f->window_bytes = std::max<size_t>(o.window_bytes, 1);
    f->window_messages = std::max<size_t>(o.window_messages, 1);
  }
  return f;
}
}  // namespace

Result<std::unique_ptr<ChannelWriter>> ShmRegistry::OpenWriter(const StreamKey& key, StreamOptions options) {
  std::lock_guard lock(shared_->mu);
  auto f = GetOrCreate(*shared_, key, options);
  if (f->writer_seen) return Status::AlreadyExists("shm channel " + key.ToString() + " already has a writer");
  f->writer_seen = f->writer_open = true;
  f->created = Clock::now();  // the reader's open_timeout runs from now on
  f->cv.notify_all();
  return std::unique_ptr<ChannelWriter>(new ShmWriter(shared_, std::move(f), options));
}

Result<std::unique_ptr<ChannelReader>> ShmRegistry::OpenReader(const StreamKey& key, StreamOptions options) {
  std::lock_guard lock(shared_->mu);
  auto f = GetOrCreate(*shared_, key, options);
  if (f->reader_seen) return Status::AlreadyExists("shm channel " + key.ToString() + " already has a reader");
  f->reader_seen = f->reader_open = true;
  f->cv.notify_all();
  return std::unique_ptr<ChannelReader>(new ShmReader(shared_, std::move(f), options));
}

void ShmRegistry::DropJob(uint64_t job) {
  std::lock_guard lock(shared_->mu);
  for (auto it = shared_->fifos.lower_bound(StreamKey{job, 0, 0}); it != shared_->fifos.end() && it->first.job == job;) {
    auto& f = it->second;
    f->dropped = true;
    shared_->buffered -= f->bytes;
    f->bytes = 0;
    f->messages.clear();
    f->cv.notify_all();
    it = shared_->fifos.erase(it);
  }
}

size_t ShmRegistry::channels() const {
  std::lock_guard lock(shared_->mu);
  return shared_->fifos.size();
}

size_t ShmRegistry::buffered_bytes() const {
  std::lock_guard lock(shared_->mu);
  return shared_->buffered;
}

}  // namespace copse::chan
