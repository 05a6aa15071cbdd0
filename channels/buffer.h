#pragma once
// Buffer: one immutable message on a channel. Copies share the same storage (reference
// counted), which is how local consumers of memory and shm channels read without copying.
// Thread-safe to share; the bytes never change after construction.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace copse::chan {

class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(std::string bytes) : storage_(std::make_shared<const std::string>(std::move(bytes))) {}
  explicit Buffer(std::shared_ptr<const std::string> storage) : storage_(std::move(storage)) {}
  static Buffer Copy(std::string_view bytes) { return Buffer(std::string(bytes)); }

  const char* data() const { return storage_ ? storage_->data() : nullptr; }
  size_t size() const { return storage_ ? storage_->size() : 0; }
  bool empty() const { return size() == 0; }
  std::string_view view() const { return storage_ ? std::string_view(*storage_) : std::string_view(); }
  const std::shared_ptr<const std::string>& storage() const { return storage_; }

 private:
  std::shared_ptr<const std::string> storage_;
};

}  // namespace copse::chan
