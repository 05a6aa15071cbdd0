#pragma once
// Buffer: one immutable message on a channel. Copies share the same storage (reference
// counted), which is how local consumers of memory and shm channels read without copying.
// Thread-safe to share; the bytes never change after construction.
//
// A Buffer may instead carry a Payload: an in-process object (say, a set of tensors) that
// consumers on the producer's daemon use as is, with no encoding, copying or hashing. Senders
// that can gather (a remote reader's fetch, a file written with writev) take its bytes in
// place through spans(); anything that needs them contiguous (data(), view(), storage(): a
// stream channel) has them encoded on first demand and cached, so every consumer sees the same
// bytes.
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace copse::chan {

/// An object carried in place of bytes. Immutable once handed to a Buffer: neither the
/// producer nor any consumer may change it afterwards. Encode() must be a pure function of the
/// object (recovery compares bytes), thread-safe, and return exactly EncodedSize() bytes.
class Payload {
 public:
  virtual ~Payload() = default;
  virtual size_t EncodedSize() const = 0;
  virtual std::string Encode() const = 0;
  /// Encode()'s bytes without encoding: spans, in order, whose concatenation is exactly those
  /// bytes, pointing into the payload (valid while it lives). Empty when the payload has no
  /// such view of itself (say, tensors in device memory): callers then use Encode().
  virtual std::vector<std::string_view> Spans() const { return {}; }
};

class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(std::string bytes) : storage_(std::make_shared<const std::string>(std::move(bytes))) {}
  explicit Buffer(std::shared_ptr<const std::string> storage) : storage_(std::move(storage)) {}
  explicit Buffer(std::shared_ptr<const Payload> payload)
      : deferred_(payload ? std::make_shared<Deferred>(std::move(payload)) : nullptr) {}
  static Buffer Copy(std::string_view bytes) { return Buffer(std::string(bytes)); }

  /// The object this message carries, or null for a plain byte message.
  const Payload* payload() const { return deferred_ ? deferred_->payload.get() : nullptr; }
  /// The payload as a T when it is one.
  template <typename T>
  std::shared_ptr<const T> payload_as() const {
    return deferred_ ? std::dynamic_pointer_cast<const T>(deferred_->payload) : nullptr;
  }

  /// Size in bytes (a payload's encoded size, without encoding it).
  size_t size() const {
    if (storage_) return storage_->size();
    return deferred_ ? deferred_->payload->EncodedSize() : 0;
  }
  bool empty() const { return size() == 0; }
  // The bytes; a payload is encoded on the first call.
  const char* data() const {
    const auto& bytes = Bytes();
    return bytes ? bytes->data() : nullptr;
  }
  std::string_view view() const {
    const auto& bytes = Bytes();
    return bytes ? std::string_view(*bytes) : std::string_view();
  }
  const std::shared_ptr<const std::string>& storage() const { return Bytes(); }
  /// The bytes as spans to gather (a payload's in place, where it can: no encoding), else as
  /// one span. Empty for an empty message. Valid while this Buffer (or a copy) lives.
  std::vector<std::string_view> spans() const {
    if (empty()) return {};
    if (deferred_) {
      auto in_place = deferred_->payload->Spans();
      size_t total = 0;
      for (std::string_view s : in_place) total += s.size();
      // Spans that do not add up to the size already framed would break the record: encode.
      if (!in_place.empty() && total == size()) return in_place;
    }
    return {view()};
  }

 private:
  struct Deferred {
    explicit Deferred(std::shared_ptr<const Payload> p) : payload(std::move(p)) {}
    std::shared_ptr<const Payload> payload;
    std::once_flag once;
    std::shared_ptr<const std::string> bytes;
  };
  const std::shared_ptr<const std::string>& Bytes() const {
    if (deferred_) {
      std::call_once(deferred_->once,
                     [d = deferred_.get()] { d->bytes = std::make_shared<const std::string>(d->payload->Encode()); });
      return deferred_->bytes;
    }
    return storage_;
  }

  std::shared_ptr<const std::string> storage_;
  std::shared_ptr<Deferred> deferred_;
};

}  // namespace copse::chan
