#include "ml/dataset.h"

#include <zlib.h>

#include <cstring>

#include "ml/philox.h"

namespace copse::ml {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;
constexpr int64_t kMaxFileBytes = int64_t{1} << 32;

Result<std::string> ReadMaybeGzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files transparently too
  if (f == nullptr) return Status::NotFound(path + ": cannot open");
  std::string out;
  char buf[1 << 16];
  while (true) {
    const int n = gzread(f, buf, sizeof(buf));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      return Status::DataLoss(path + ": corrupted gzip stream (" + msg + ")");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(out.size()) > kMaxFileBytes)
      return gzclose(f), Status::DataLoss(path + ": larger than 4 GiB, not an IDX file");
  }
  const int rc = gzclose(f);
  if (rc != Z_OK && rc != Z_BUF_ERROR)
    return Status::DataLoss(path + ": corrupted gzip stream (close: " + std::to_string(rc) + ")");
  return out;
}

uint32_t BigEndian32(const std::string& b, size_t at) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data() + at);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

Status CheckHeader(const std::string& path, const std::string& b, uint32_t magic, size_t header, const char* kind) {
  if (b.size() < header)
    return Status::DataLoss(path + ": " + std::to_string(b.size()) + " bytes, too short for an IDX " + kind + " header");
  if (BigEndian32(b, 0) != magic) {
    char got[16];
    std::snprintf(got, sizeof(got), "0x%08x", BigEndian32(b, 0));
    return Status::DataLoss(path + ": bad magic number " + got + " for IDX " + kind);
  }
  return Status::OK();
}

/// The first `keep` labels of an IDX labels file's bytes `lab` (header checked), each in [0, 10).
Result<std::vector<int32_t>> ParseLabels(const std::string& path, const std::string& lab, int64_t keep) {
  std::vector<int32_t> labels(static_cast<size_t>(keep));
  for (int64_t i = 0; i < keep; ++i) {
    const int v = static_cast<unsigned char>(lab[static_cast<size_t>(8 + i)]);
    if (v > 9)
      return Status::DataLoss(path + ": label " + std::to_string(v) + " at index " + std::to_string(i) + " is outside [0, 10)");
    labels[static_cast<size_t>(i)] = v;
  }
  return labels;
}

}  // namespace

Dataset::Dataset(Tensor images, std::vector<int32_t> labels) : images_(std::move(images)), labels_(std::move(labels)) {
  if (size() > 0 ? labels_.size() % static_cast<size_t>(size()) != 0 || labels_.empty() : !labels_.empty())
    throw std::invalid_argument("Dataset: " + std::to_string(labels_.size()) + " labels for " + std::to_string(size()) +
                                " examples");
}

std::vector<int32_t> Dataset::LabelsOf(std::span<const int64_t> indices) const {
  const int64_t k = labels_per_example();
  std::vector<int32_t> out;
  out.reserve(indices.size() * static_cast<size_t>(k));
  for (const int64_t idx : indices) {
    if (idx < 0 || idx >= size())
      throw std::out_of_range("Dataset: index " + std::to_string(idx) + " of " + std::to_string(size()));
    out.insert(out.end(), labels_.begin() + idx * k, labels_.begin() + (idx + 1) * k);
  }
  return out;
}

Batch Dataset::Gather(std::span<const int64_t> indices, Device* device) const {
  const int64_t b = static_cast<int64_t>(indices.size());
  const int64_t row = size() == 0 ? 0 : images_.numel() / size();
  Shape shape = images_.shape();
  shape[0] = b;
  Tensor host = Tensor::Empty(shape, CpuDevice());
  Batch out;
  out.labels = LabelsOf(indices);  // checks the indices
  const float* src = images_.data();
  float* dst = host.data();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t idx = indices[static_cast<size_t>(i)];
    std::memcpy(dst + i * row, src + idx * row, static_cast<size_t>(row) * sizeof(float));
  }
  out.images = device == CpuDevice() ? host : host.To(device);
  return out;
}

Batch Dataset::Range(int64_t begin, int64_t end, Device* device) const {
  std::vector<int64_t> idx;
  for (int64_t i = begin; i < end; ++i) idx.push_back(i);
  return Gather(idx, device);
}

Result<Dataset> ReadIdx(const std::string& images_path, const std::string& labels_path, const DatasetOptions& options) {
  COPSE_ASSIGN_OR_RETURN(std::string img, ReadMaybeGzip(images_path));
  COPSE_ASSIGN_OR_RETURN(std::string lab, ReadMaybeGzip(labels_path));
  COPSE_RETURN_NOT_OK(CheckHeader(images_path, img, kImagesMagic, 16, "images"));
  COPSE_RETURN_NOT_OK(CheckHeader(labels_path, lab, kLabelsMagic, 8, "labels"));
  const int64_t n = BigEndian32(img, 4), rows = BigEndian32(img, 8), cols = BigEndian32(img, 12);
  const int64_t n_labels = BigEndian32(lab, 4);
  if (rows == 0 || cols == 0 || rows > 4096 || cols > 4096)
    return Status::DataLoss(images_path + ": implausible image size " + std::to_string(rows) + "x" + std::to_string(cols));
  if (static_cast<int64_t>(img.size()) != 16 + n * rows * cols)
    return Status::DataLoss(images_path + ": header says " + std::to_string(n) + " images of " + std::to_string(rows) + "x" +
                            std::to_string(cols) + " (" + std::to_string(16 + n * rows * cols) + " bytes) but the file has " +
                            std::to_string(img.size()) + " bytes");
  if (static_cast<int64_t>(lab.size()) != 8 + n_labels)
    return Status::DataLoss(labels_path + ": header says " + std::to_string(n_labels) + " labels but the file has " +
                            std::to_string(lab.size() - 8));
  if (n_labels != n)
    return Status::DataLoss(images_path + " has " + std::to_string(n) + " images but " + labels_path + " has " +
                            std::to_string(n_labels) + " labels");
  const int64_t keep = options.limit >= 0 ? std::min(options.limit, n) : n;
  Tensor images = Tensor::Empty({keep, 1, rows, cols}, CpuDevice());
  const auto* px = reinterpret_cast<const unsigned char*>(img.data() + 16);
  float* dst = images.data();
  const float scale = options.standardize ? 1.0f / (255.0f * options.std) : 1.0f / 255.0f;
  const float shift = options.standardize ? options.mean / options.std : 0.0f;
  for (int64_t i = 0; i < keep * rows * cols; ++i) dst[i] = px[i] * scale - shift;
  COPSE_ASSIGN_OR_RETURN(std::vector<int32_t> labels, ParseLabels(labels_path, lab, keep));
  return Dataset(std::move(images), std::move(labels));
}

Result<std::vector<int32_t>> LoadFashionMnistLabels(const std::string& dir, Split split, int64_t limit) {
  const std::string path = dir + (split == Split::kTrain ? "/train" : "/t10k") + "-labels-idx1-ubyte.gz";
  COPSE_ASSIGN_OR_RETURN(std::string lab, ReadMaybeGzip(path));
  COPSE_RETURN_NOT_OK(CheckHeader(path, lab, kLabelsMagic, 8, "labels"));
  const int64_t n = BigEndian32(lab, 4);
  if (static_cast<int64_t>(lab.size()) != 8 + n)
    return Status::DataLoss(path + ": header says " + std::to_string(n) + " labels but the file has " +
                            std::to_string(lab.size() - 8));
  return ParseLabels(path, lab, limit >= 0 ? std::min(limit, n) : n);
}

Result<Dataset> LoadFashionMnist(const std::string& dir, Split split, const DatasetOptions& options) {
  const std::string prefix = dir + (split == Split::kTrain ? "/train" : "/t10k");
  return ReadIdx(prefix + "-images-idx3-ubyte.gz", prefix + "-labels-idx1-ubyte.gz", options);
}

std::vector<int64_t> EpochOrder(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  PhiloxStream rng(MixSeed(seed, static_cast<uint64_t>(epoch), 0x5EED), 0);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.NextBelow(static_cast<uint64_t>(i + 1)));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

std::vector<int64_t> ShardIndices(std::span<const int64_t> indices, int replica, int replicas) {
  std::vector<int64_t> out;
  for (size_t i = static_cast<size_t>(replica); i < indices.size(); i += static_cast<size_t>(replicas)) out.push_back(indices[i]);
  return out;
}

static std::pair<size_t, size_t> Part(size_t n, int part, int parts) {
  const size_t p = static_cast<size_t>(parts), i = static_cast<size_t>(part);
  const size_t base = n / p, extra = n % p;
  const size_t begin = i * base + std::min(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

std::vector<int64_t> ShardBatch(std::span<const int64_t> batch, int replica, int replicas) {
  const auto [b, e] = Part(batch.size(), replica, replicas);
  return std::vector<int64_t>(batch.begin() + static_cast<ptrdiff_t>(b), batch.begin() + static_cast<ptrdiff_t>(e));
}

std::vector<std::vector<int64_t>> MakeBatches(std::span<const int64_t> indices, int64_t batch_size, bool drop_last) {
  std::vector<std::vector<int64_t>> out;
  const auto n = static_cast<int64_t>(indices.size());
  for (int64_t b = 0; b < n; b += batch_size) {
    const int64_t e = std::min(n, b + batch_size);
    if (drop_last && e - b < batch_size) break;
    out.emplace_back(indices.begin() + b, indices.begin() + e);
  }
  return out;
}

std::vector<Batch> SplitMicroBatches(const Batch& batch, int count) {
  std::vector<Batch> out;
  const size_t examples = static_cast<size_t>(batch.examples());
  const size_t k = examples == 0 ? 1 : batch.labels.size() / examples;
  for (int m = 0; m < count; ++m) {
    const auto [b, e] = Part(examples, m, count);
    Batch mb;
    mb.images = batch.images.Rows(static_cast<int64_t>(b), static_cast<int64_t>(e));
    mb.labels.assign(batch.labels.begin() + static_cast<ptrdiff_t>(b * k), batch.labels.begin() + static_cast<ptrdiff_t>(e * k));
    out.push_back(std::move(mb));
  }
  return out;
}

}  // namespace copse::ml
