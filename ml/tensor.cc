#include "ml/tensor.h"

#include <cassert>
#include <cstring>
#include <stdexcept>

namespace copse::ml {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Storage::Storage(Device* device, size_t bytes) : device_(device), bytes_(bytes), data_(device->Allocate(bytes)) {}

Storage::~Storage() { device_->Free(data_, bytes_); }

Tensor Tensor::Empty(const Shape& shape, Device* device, DType dtype) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(device, static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype));
  return t;
}

void Tensor::ThrowWrongType(const char* accessor) const {
  throw std::logic_error(std::string("Tensor::") + accessor + " of a " + DTypeName(dtype_) + " tensor " + ShapeToString(shape_));
}

Tensor Tensor::Zeros(const Shape& shape, Device* device) { return Full(shape, 0.0f, device); }

Tensor Tensor::Full(const Shape& shape, float value, Device* device) {
  Tensor t = Empty(shape, device);
  t.Fill(value);
  return t;
}

Tensor Tensor::FromVector(const Shape& shape, const std::vector<float>& values, Device* device) {
  if (static_cast<int64_t>(values.size()) != NumElements(shape))
    throw std::invalid_argument("Tensor::FromVector: " + std::to_string(values.size()) + " values for shape " +
                                ShapeToString(shape));
  Tensor t = Empty(shape, device);
  device->CopyFromHost(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

std::vector<float> Tensor::ToVector() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  if (!defined() || out.empty()) return out;
  if (dtype_ == DType::kFloat32) {
    device()->CopyToHost(out.data(), data(), bytes());
  } else {
    std::vector<uint16_t> bits(out.size());
    device()->CopyToHost(bits.data(), raw_data(), bytes());
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = dtype_ == DType::kFloat16 ? Float16ToFloat(bits[i]) : BFloat16ToFloat(bits[i]);
  }
  return out;
}

Tensor Tensor::Cast(DType dtype) const {
  if (dtype == dtype_ || !defined()) return *this;
  Tensor t = Empty(shape_, device(), dtype);
  const size_t n = static_cast<size_t>(numel());
  if (n == 0) return t;
  if (dtype_ != DType::kFloat32 && dtype != DType::kFloat32) return Cast(DType::kFloat32).Cast(dtype);  // between 16-bit types
  if (dtype == DType::kBFloat16)
    device()->FloatToBFloat16(data(), n, t.bf16_data());
  else if (dtype == DType::kFloat16)
    device()->FloatToFloat16(data(), n, t.f16_data());
  else if (dtype_ == DType::kFloat16)
    device()->Float16ToFloat(f16_data(), n, t.data());
  else
    device()->BFloat16ToFloat(bf16_data(), n, t.data());
  return t;
}

Tensor Tensor::To(Device* target) const {
  Tensor t = Empty(shape_, target, dtype_);
  t.CopyFrom(*this);
  return t;
}

void Tensor::CopyFrom(const Tensor& src) const {
  if (src.numel() != numel() || src.dtype() != dtype_)
    throw std::invalid_argument("Tensor::CopyFrom: " + std::string(DTypeName(src.dtype())) + ShapeToString(src.shape()) +
                                " into " + DTypeName(dtype_) + ShapeToString(shape_));
  if (numel() == 0) return;
  Device* from = src.device();
  Device* to = device();
  if (from == to) {
    to->CopyOnDevice(raw_data(), src.raw_data(), bytes());
  } else if (from->type() == DeviceType::kCpu) {
    to->CopyFromHost(raw_data(), src.raw_data(), bytes());
  } else if (to->type() == DeviceType::kCpu) {
    from->CopyToHost(raw_data(), src.raw_data(), bytes());
  } else {  // GPU to another GPU: through the host (peer copies are the channels' business).
    std::vector<char> host(bytes());
    from->CopyToHost(host.data(), src.raw_data(), bytes());
    to->CopyFromHost(raw_data(), host.data(), bytes());
  }
}

void Tensor::Fill(float value) const {
  if (numel() > 0) device()->Fill(data(), static_cast<size_t>(numel()), value);
}

Tensor Tensor::Reshape(const Shape& shape) const {
  if (NumElements(shape) != numel())
    throw std::invalid_argument("Tensor::Reshape: " + ShapeToString(shape_) + " to " + ShapeToString(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::Rows(int64_t begin, int64_t end) const {
  if (shape_.empty() || begin < 0 || end < begin || end > shape_[0])
    throw std::out_of_range("Tensor::Rows: [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " +
                            ShapeToString(shape_));
  Tensor t = *this;
  const int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  t.offset_ += begin * row;
  t.shape_[0] = end - begin;
  return t;
}

bool Tensor::BitwiseEquals(const Tensor& other) const {
  if (shape_ != other.shape_ || dtype_ != other.dtype_ || defined() != other.defined()) return false;
  if (!defined() || bytes() == 0) return true;
  std::vector<char> a(bytes()), b(bytes());
  device()->CopyToHost(a.data(), raw_data(), bytes());
  other.device()->CopyToHost(b.data(), other.raw_data(), bytes());
  return a == b;
}

}  // namespace copse::ml
