#include "vertex/output_mirror.h"

#include "channels/remote_reader.h"
#include "vertex/protocol_types.h"

namespace copse::vertex {

OutputMirror::OutputMirror(chan::OutputStore& store, std::string secret, std::shared_ptr<const tls::Context> tls,
                           std::function<void(const protocol::DaemonToJm&)> send)
    : store_(store), secret_(std::move(secret)), tls_(std::move(tls)), send_(std::move(send)), thread_([this] { Loop(); }) {}

OutputMirror::~OutputMirror() {
  std::optional<protocol::StoreLocation> fetching;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    fetching = current_;
  }
  work_.notify_all();
  // A fetch from a peer that stopped answering would hold the join for its read timeout.
  if (fetching) chan::AbortFetchesFrom(fetching->host(), static_cast<uint16_t>(fetching->port()));
  thread_.join();
}

void OutputMirror::Add(protocol::Mirror request) {
  {
    std::lock_guard lock(mu_);
    pending_.push_back(std::move(request));
  }
  work_.notify_one();
}

void OutputMirror::Loop() {
  while (true) {
    protocol::Mirror request;
    {
      std::unique_lock lock(mu_);
      work_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (stopping_) return;
      request = std::move(pending_.front());
      pending_.pop_front();
      current_ = request.from();
    }
    auto copied = Copy(request);
    {
      std::lock_guard lock(mu_);
      current_.reset();
    }
    if (stopping_) return;  // the daemon stops: the job manager learns of nothing more from it
    protocol::DaemonToJm msg;
    protocol::Mirrored& done = *msg.mutable_mirrored();
    *done.mutable_key() = request.key();
    done.set_ok(copied.ok());
    if (copied.ok()) {
      done.set_bytes(*copied);
    } else {
      done.set_error(copied.status().message());  // the job manager logs it in the job's log
    }
    send_(msg);
  }
}

Result<uint64_t> OutputMirror::Copy(const protocol::Mirror& request) {
  const chan::OutputKey key = FromProtocol(request.key());
  // Held already (asked twice, or this daemon produced it): nothing to copy.
  if (store_.Contains(key)) {
    COPSE_ASSIGN_OR_RETURN(const uint64_t size, store_.Size(key));
    return size;
  }
  chan::RemoteReaderOptions options;
  options.tls = tls_;
  COPSE_ASSIGN_OR_RETURN(auto reader, chan::OpenRemoteReader(request.from().host(), static_cast<uint16_t>(request.from().port()),
                                                             key, secret_, options));
  COPSE_ASSIGN_OR_RETURN(auto writer, store_.CreateWriter(key, chan::StorageKind::kMemory));
  uint64_t bytes = 0;
  while (true) {
    if (stopping_) return Status::Cancelled("the daemon is stopping");
    COPSE_ASSIGN_OR_RETURN(auto message, reader->Next());
    if (!message) break;
    bytes += message->size();
    COPSE_RETURN_NOT_OK(writer->Write(std::move(*message)));
  }
  COPSE_RETURN_NOT_OK(writer->Close());
  return bytes;
}

}  // namespace copse::vertex
