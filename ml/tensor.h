#pragma once
// Tensor: a dense, contiguous, row-major array with a shape and an element type (float32 unless
// made otherwise; ml/dtype.h), living on one Device.
// A Tensor is a cheap handle: copies share the same storage (like torch.Tensor); Clone() makes
// a deep copy. Reshape() and Rows() return views of the same storage. Storage is freed (back to
// its device's cache) when the last handle goes away.
// Thread-safety: handles may be copied across threads; concurrent writes to the same storage
// need external synchronization, like any array.
//
//   Tensor x = Tensor::FromVector({2, 3}, {1, 2, 3, 4, 5, 6});
//   Tensor g = x.To(*CudaDevice());   // device copy
//   std::vector<float> back = g.ToVector();
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ml/device.h"
#include "ml/dtype.h"

namespace copse::ml {

using Shape = std::vector<int64_t>;

/// Product of the dimensions (1 for a scalar shape {}).
int64_t NumElements(const Shape& shape);
/// "[128, 784]".
std::string ShapeToString(const Shape& shape);

/// Device memory with its owner; returns itself to the device on destruction.
class Storage {
 public:
  Storage(Device* device, size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device* device() const { return device_; }

 private:
  Device* device_;
  size_t bytes_;
  void* data_;
};

class Tensor {
 public:
  /// An undefined tensor (defined() == false).
  Tensor() = default;

  /// Uninitialized contents.
  static Tensor Empty(const Shape& shape, Device* device = CpuDevice(), DType dtype = DType::kFloat32);
  static Tensor Zeros(const Shape& shape, Device* device = CpuDevice());
  static Tensor Full(const Shape& shape, float value, Device* device = CpuDevice());
  /// `values.size()` must equal NumElements(shape).
  static Tensor FromVector(const Shape& shape, const std::vector<float>& values, Device* device = CpuDevice());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + ndim() : i]; }
  int64_t numel() const { return NumElements(shape_); }
  DType dtype() const { return dtype_; }
  size_t bytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  Device* device() const { return storage_ ? storage_->device() : nullptr; }
  bool is_cpu() const { return device() != nullptr && device()->type() == DeviceType::kCpu; }

  /// Device pointer to the first element (a host pointer on the CPU) of a float32 tensor;
  /// throws std::logic_error for another type (a kernel would misread its bytes).
  float* data() const {
    if (dtype_ != DType::kFloat32) ThrowWrongType("data()");
    return storage_ ? static_cast<float*>(storage_->data()) + offset_ : nullptr;
  }
  /// The same for a bfloat16 tensor (its elements' bits).
  uint16_t* bf16_data() const {
    if (dtype_ != DType::kBFloat16) ThrowWrongType("bf16_data()");
    return storage_ ? static_cast<uint16_t*>(storage_->data()) + offset_ : nullptr;
  }
  /// The same for a float16 tensor.
  uint16_t* f16_data() const {
    if (dtype_ != DType::kFloat16) ThrowWrongType("f16_data()");
    return storage_ ? static_cast<uint16_t*>(storage_->data()) + offset_ : nullptr;
  }
  /// The first element's address, whatever the type.
  void* raw_data() const {
    return storage_ ? static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(DTypeSize(dtype_)) : nullptr;
  }

  /// A copy of the contents on the host, as float32 values.
  std::vector<float> ToVector() const;
  /// This tensor converted to `dtype` on its device (itself when it has that type already).
  Tensor Cast(DType dtype) const;
  /// A deep copy on `device` (a deep copy even when already there).
  Tensor To(Device* device) const;
  Tensor Clone() const { return To(device()); }
  /// Copies `src` (same number of elements and type, any device) into this tensor's storage.
  void CopyFrom(const Tensor& src) const;
  void Fill(float value) const;
  /// A view with another shape and the same number of elements.
  Tensor Reshape(const Shape& shape) const;
  /// A view of rows [begin, end) along the first dimension.
  Tensor Rows(int64_t begin, int64_t end) const;
  /// True when shapes and types are equal and every element is bitwise equal.
  bool BitwiseEquals(const Tensor& other) const;

 private:
  [[noreturn]] void ThrowWrongType(const char* accessor) const;

  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_;
  DType dtype_ = DType::kFloat32;
};

/// Named tensors in a fixed order: a parameter set, its gradients, an optimizer's state.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

}  // namespace copse::ml
