#pragma once
// Datasets: the Fashion-MNIST IDX files (as shipped by Debian's dataset-fashion-mnist, gzip
// compressed) read into memory, plus the deterministic sampling machinery every training
// program uses: per-epoch shuffles from (seed, epoch), sharding by replica, batches and
// micro-batches. Same seed => same order on every machine, for any number of threads.
//
//   Dataset train = *LoadFashionMnist("/usr/share/datasets/fashion-mnist", Split::kTrain);
//   std::vector<int64_t> order = EpochOrder(train.size(), seed, epoch);
//   for (auto& idx : MakeBatches(order, 128)) {
//     Batch b = train.Gather(idx);                 // images [B,1,28,28], labels
//     for (Batch& mb : SplitMicroBatches(b, 4)) ...
//   }
//
// A Dataset is immutable after loading; Gather is thread-safe.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ml/tensor.h"

namespace copse::ml {

constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

enum class Split { kTrain, kTest };

struct DatasetOptions {
  /// Keep only the first `limit` examples (all when < 0).
  int64_t limit = -1;
  /// Pixels are scaled to [0, 1]; with `standardize` also (x - mean) / std.
  bool standardize = false;
  float mean = 0.2860f;  // Fashion-MNIST training set statistics
  float std = 0.3530f;
};

/// A labelled batch on some device: B examples with k labels each (k = 1 for an image, its
/// class; k = T for a text window, the next token at each position).
struct Batch {
  Tensor images;                // [B, 1, H, W] images, or [B, T] token ids
  std::vector<int32_t> labels;  // B * k values, example-major
  /// Rows of the loss: labels (images, or tokens of text).
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  int64_t examples() const { return images.defined() ? images.dim(0) : 0; }
};

class Dataset {
 public:
  Dataset() = default;
  /// `labels` holds the same number k >= 1 of labels for each of the images' N examples.
  Dataset(Tensor images, std::vector<int32_t> labels);
  /// Examples (images or text windows).
  int64_t size() const { return images_.defined() ? images_.dim(0) : 0; }
  int64_t labels_per_example() const { return size() == 0 ? 1 : static_cast<int64_t>(labels_.size()) / size(); }
  const Tensor& images() const { return images_; }  // [N, 1, H, W] or [N, T] on the CPU
  const std::vector<int32_t>& labels() const { return labels_; }
  /// The labels of the examples at `indices`, one example's after another.
  std::vector<int32_t> LabelsOf(std::span<const int64_t> indices) const;
  /// The examples at `indices`, copied into one batch on `device`.
  Batch Gather(std::span<const int64_t> indices, Device* device = CpuDevice()) const;
  /// Examples [begin, end) in storage order.
  Batch Range(int64_t begin, int64_t end, Device* device = CpuDevice()) const;

 private:
  Tensor images_;
  std::vector<int32_t> labels_;
};

/// Reads one images/labels pair of IDX files (gzip-compressed or plain).
Result<Dataset> ReadIdx(const std::string& images_path, const std::string& labels_path, const DatasetOptions& options = {});
/// `dir`/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz.
Result<Dataset> LoadFashionMnist(const std::string& dir, Split split, const DatasetOptions& options = {});
/// The labels of a Fashion-MNIST split alone (its first `limit`; all when < 0): what a vertex
/// that reads no images needs, without decompressing 47 MB of pixels (a fresh daemon's first
/// vertex of a pipeline's later stage, recovering).
Result<std::vector<int32_t>> LoadFashionMnistLabels(const std::string& dir, Split split, int64_t limit = -1);

/// A permutation of [0, n) that depends only on (seed, epoch) (Fisher-Yates over Philox).
std::vector<int64_t> EpochOrder(int64_t n, uint64_t seed, int64_t epoch);
/// Replica r of R of `indices`: every R-th element starting at r (torch DistributedSampler
/// without padding), for sharding a dataset.
std::vector<int64_t> ShardIndices(std::span<const int64_t> indices, int replica, int replicas);
/// Replica r of R of one global batch: a contiguous part, sizes differing by at most one, so
/// that R data-parallel replicas together process exactly the single-process batch.
std::vector<int64_t> ShardBatch(std::span<const int64_t> batch, int replica, int replicas);
/// Consecutive batches of `batch_size` (the last one smaller unless drop_last).
std::vector<std::vector<int64_t>> MakeBatches(std::span<const int64_t> indices, int64_t batch_size, bool drop_last = false);
/// Splits a batch into `count` micro-batches of examples (contiguous, sizes differing by at
/// most one; views of the batch's images, no copy), each with its examples' labels.
std::vector<Batch> SplitMicroBatches(const Batch& batch, int count);

}  // namespace copse::ml
