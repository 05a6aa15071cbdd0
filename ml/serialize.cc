#include "ml/serialize.h"

#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <memory>

namespace copse::ml {
namespace {

constexpr char kMagic[8] = {'C', 'O', 'P', 'S', 'E', 'T', 'N', 'S'};
constexpr uint32_t kVersion = 1;
constexpr int kMaxDims = 8;

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  template <typename T>
  bool Get(T* v) {
    if (b_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Bytes(size_t n, std::string_view* out) {
    if (b_.size() - pos_ < n) return false;
    *out = b_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  size_t remaining() const { return b_.size() - pos_; }
  size_t pos() const { return pos_; }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

Status Loss(const std::string& what) { return Status::DataLoss("tensor bytes: " + what); }

void AppendPrefix(std::string& out, size_t count) {
  out.append(kMagic, sizeof(kMagic));
  Put<uint32_t>(out, kVersion);
  Put<uint32_t>(out, static_cast<uint32_t>(count));
}

/// What goes on the wire for `t`: an undefined tensor (no storage, yet a product of no
/// dimensions says one element) as an empty one, never a read through its null data.
const Tensor& Wire(const Tensor& t) {
  static const Tensor* const kEmpty = new Tensor(Tensor::Zeros({0}));
  return t.defined() ? t : *kEmpty;
}

/// What comes before a tensor's data.
void AppendTensorHeader(std::string& out, const std::string& name, const Tensor& t) {
  Put<uint32_t>(out, static_cast<uint32_t>(name.size()));
  out.append(name);
  Put<uint8_t>(out, static_cast<uint8_t>(t.dtype()));
  Put<uint8_t>(out, static_cast<uint8_t>(t.ndim()));
  Put<uint16_t>(out, 0);
  for (int64_t d : t.shape()) Put<int64_t>(out, d);
}

}  // namespace

uint64_t Checksum(std::string_view bytes) { return XXH64(bytes.data(), bytes.size(), 0); }

size_t EncodedSize(const NamedTensors& tensors) {
  size_t total = sizeof(kMagic) + 8 + 8;
  for (const auto& [name, tensor] : tensors) {
    const Tensor& t = Wire(tensor);
    total += 8 + name.size() + 8 * t.ndim() + t.bytes();
  }
  return total;
}

std::string SerializeTensors(const NamedTensors& tensors) {
  std::string out;
  out.reserve(EncodedSize(tensors));
  AppendPrefix(out, tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const Tensor& t = Wire(tensor);
    AppendTensorHeader(out, name, t);
    if (t.bytes() == 0) continue;
    if (t.is_cpu()) {
      out.append(static_cast<const char*>(t.raw_data()), t.bytes());
    } else {
      const size_t at = out.size();
      out.resize(at + t.bytes());
      t.device()->CopyToHost(out.data() + at, t.raw_data(), t.bytes());
    }
  }
  Put<uint64_t>(out, Checksum(out));
  return out;
}

std::vector<std::string_view> SerializedSpans(const NamedTensors& tensors, std::string* scratch) {
  for (const auto& [name, t] : tensors) {
    if (Wire(t).bytes() > 0 && !t.is_cpu()) return {};
  }
  std::string headers;
  std::vector<size_t> header_ends;  // headers[previous end, this end) comes before tensor i's data
  AppendPrefix(headers, tensors.size());
  for (const auto& [name, t] : tensors) {
    AppendTensorHeader(headers, name, Wire(t));
    header_ends.push_back(headers.size());
  }
  std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)> hash(XXH64_createState(), XXH64_freeState);
  XXH64_reset(hash.get(), 0);
  size_t begin = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    XXH64_update(hash.get(), headers.data() + begin, header_ends[i] - begin);
    XXH64_update(hash.get(), Wire(tensors[i].second).raw_data(), Wire(tensors[i].second).bytes());
    begin = header_ends[i];
  }
  XXH64_update(hash.get(), headers.data() + begin, headers.size() - begin);  // the prefix, when no tensors
  Put<uint64_t>(headers, XXH64_digest(hash.get()));
  *scratch = std::move(headers);

  const std::string_view all(*scratch);
  std::vector<std::string_view> spans;
  begin = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    spans.push_back(all.substr(begin, header_ends[i] - begin));
    if (const Tensor& t = Wire(tensors[i].second); t.bytes() > 0)
      spans.emplace_back(static_cast<const char*>(t.raw_data()), t.bytes());
    begin = header_ends[i];
  }
  spans.push_back(all.substr(begin));  // the prefix (when no tensors) and the trailer
  return spans;
}

Result<NamedTensors> DeserializeTensors(std::string_view bytes, Device* device) {
  if (bytes.size() < sizeof(kMagic) + 8 + 8)
    return Loss("truncated: " + std::to_string(bytes.size()) + " bytes is shorter than a header");
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) return Loss("bad magic (not a copse tensor encoding)");
  const std::string_view body = bytes.substr(0, bytes.size() - 8);
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + body.size(), 8);
  if (Checksum(body) != stored) return Loss("checksum mismatch (corrupted or truncated)");
  Reader r(body.substr(sizeof(kMagic)));
  uint32_t version = 0, count = 0;
  r.Get(&version);
  r.Get(&count);
  if (version != kVersion) return Loss("unsupported version " + std::to_string(version));
  NamedTensors out;
  for (uint32_t i = 0; i < count; ++i) {
    const std::string where = "tensor " + std::to_string(i) + ": ";
    uint32_t name_len;
    std::string_view name;
    uint8_t dtype, ndim;
    uint16_t reserved;
    if (!r.Get(&name_len) || !r.Bytes(name_len, &name) || !r.Get(&dtype) || !r.Get(&ndim) || !r.Get(&reserved))
      return Loss(where + "truncated header");
    if (dtype > static_cast<uint8_t>(DType::kFloat16)) return Loss(where + "unknown dtype " + std::to_string(dtype));
    const DType type = static_cast<DType>(dtype);
    const size_t element = DTypeSize(type);
    if (ndim > kMaxDims) return Loss(where + "too many dimensions (" + std::to_string(ndim) + ")");
    Shape shape(ndim);
    // The product of the non-zero dimensions must not overflow, even in an empty tensor: one
    // that wrapped round (64 x 5·2^60 is 0 modulo 2^64, behind a zero dimension) passed, and
    // the tensor's element count then overflowed (found by the tensor fuzzer). Every partial
    // product NumElements forms is at most this one.
    int64_t nonzero = 1;
    bool empty = false;
    for (auto& d : shape) {
      if (!r.Get(&d)) return Loss(where + "truncated shape");
      if (d < 0) return Loss(where + "negative dimension");
      if (d == 0) {
        empty = true;
      } else if (__builtin_mul_overflow(nonzero, d, &nonzero)) {
        return Loss(where + "shape too large (its element count overflows)");
      }
    }
    const uint64_t numel = empty ? 0 : static_cast<uint64_t>(nonzero);
    if (numel > r.remaining() / element) return Loss(where + "shape larger than the data");
    std::string_view data;
    if (!r.Bytes(numel * element, &data)) return Loss(where + "truncated data");
    Tensor t = Tensor::Empty(shape, device, type);
    if (numel > 0) device->CopyFromHost(t.raw_data(), data.data(), data.size());
    out.emplace_back(std::string(name), std::move(t));
  }
  if (r.remaining() != 0) return Loss(std::to_string(r.remaining()) + " trailing bytes");
  return out;
}

std::string SerializeTensor(const Tensor& tensor) { return SerializeTensors({{"", tensor}}); }

Result<Tensor> DeserializeTensor(std::string_view bytes, Device* device) {
  COPSE_ASSIGN_OR_RETURN(NamedTensors all, DeserializeTensors(bytes, device));
  if (all.size() != 1) return Status::DataLoss("tensor bytes: expected one tensor, found " + std::to_string(all.size()));
  return std::move(all[0].second);
}

std::string Digest(const NamedTensors& tensors) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(Checksum(SerializeTensors(tensors))));
  return buf;
}

}  // namespace copse::ml
