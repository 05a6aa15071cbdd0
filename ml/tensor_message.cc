#include "ml/tensor_message.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <random>

#include "ml/serialize.h"

namespace copse::ml {
namespace {

/// Process-unique message ids, started at a random point so they never meet the byte-derived
/// keys of TensorMessageKey by more than chance (2^-64).
uint64_t NextId() {
  static std::atomic<uint64_t> next{std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1};
  return next.fetch_add(2, std::memory_order_relaxed);
}

class TensorSetPayload final : public chan::Payload {
 public:
  explicit TensorSetPayload(NamedTensors tensors)
      : tensors_(std::move(tensors)), size_(ml::EncodedSize(tensors_)), id_(NextId()) {}
  size_t EncodedSize() const override { return size_; }
  std::string Encode() const override { return SerializeTensors(tensors_); }
  /// The encoding with the tensors' data in place (a remote fetch, a durable copy): only the
  /// headers and the checksum trailer are made, once.
  std::vector<std::string_view> Spans() const override {
    std::call_once(spans_once_, [this] { spans_ = SerializedSpans(tensors_, &span_headers_); });
    return spans_;
  }
  const NamedTensors& tensors() const { return tensors_; }
  uint64_t id() const { return id_; }

 private:
  const NamedTensors tensors_;
  const size_t size_;
  const uint64_t id_;
  mutable std::once_flag spans_once_;
  mutable std::string span_headers_;
  mutable std::vector<std::string_view> spans_;
};

}  // namespace

chan::Buffer TensorMessage(NamedTensors tensors) {
  return chan::Buffer(std::shared_ptr<const chan::Payload>(std::make_shared<TensorSetPayload>(std::move(tensors))));
}

chan::Buffer SingleTensorMessage(Tensor tensor) { return TensorMessage({{"", std::move(tensor)}}); }

Result<NamedTensors> ReadTensorMessage(const chan::Buffer& message, bool* shared) {
  if (auto p = message.payload_as<TensorSetPayload>()) {
    if (shared) *shared = true;
    return p->tensors();
  }
  if (shared) *shared = false;
  return DeserializeTensors(message.view());
}

Result<Tensor> ReadSingleTensor(const chan::Buffer& message) {
  if (auto p = message.payload_as<TensorSetPayload>()) {
    if (p->tensors().size() != 1)
      return Status::DataLoss("tensor message: expected one tensor, found " + std::to_string(p->tensors().size()));
    return p->tensors()[0].second;
  }
  return DeserializeTensor(message.view());
}

uint64_t TensorMessageKey(const chan::Buffer& message) {
  if (auto p = message.payload_as<TensorSetPayload>()) return p->id();
  const std::string_view bytes = message.view();
  if (bytes.size() < 8) return 0;
  uint64_t h;
  std::memcpy(&h, bytes.data() + bytes.size() - 8, 8);
  return (h ^ (static_cast<uint64_t>(bytes.size()) * 0x9e3779b97f4a7c15ULL)) & ~uint64_t{1};  // even: never an id
}

}  // namespace copse::ml
