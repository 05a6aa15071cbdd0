#include <doctest/doctest.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "ml/dataset.h"

using namespace copse::ml;

namespace {

bool HaveFashionMnist() { return std::filesystem::exists(std::string(kFashionMnistDir) + "/t10k-images-idx3-ubyte.gz"); }

std::string TempPath(const std::string& name) { return (std::filesystem::temp_directory_path() / ("copse_ml_" + name)).string(); }

void WriteGz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

std::string Be32(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

}  // namespace

TEST_CASE("Dataset.LoadsFashionMnistNormalized") {
  if (!HaveFashionMnist()) {
    MESSAGE("dataset-fashion-mnist not installed; skipping");
    return;
  }
  DatasetOptions o;
  o.limit = 500;
  auto test = LoadFashionMnist(kFashionMnistDir, Split::kTest, o);
  REQUIRE(test.ok());
  CHECK(test->size() == 500);
  CHECK(test->images().shape() == Shape{500, 1, 28, 28});
  const std::vector<float> px = test->images().ToVector();
  CHECK(*std::min_element(px.begin(), px.end()) == 0.0f);
  CHECK(*std::max_element(px.begin(), px.end()) == 1.0f);
  std::set<int32_t> classes(test->labels().begin(), test->labels().end());
  CHECK(classes.size() == 10);
  CHECK(test->labels()[0] == 9);  // the first t10k image is an ankle boot
  const Batch b = test->Gather(std::vector<int64_t>{3, 1});
  CHECK(b.labels == std::vector<int32_t>{test->labels()[3], test->labels()[1]});
  // The labels alone (a vertex that reads no images) are the same, without the pixels.
  auto labels = LoadFashionMnistLabels(kFashionMnistDir, Split::kTest, 500);
  REQUIRE(labels.ok());
  CHECK(*labels == test->labels());
  auto all = LoadFashionMnistLabels(kFashionMnistDir, Split::kTrain);
  REQUIRE(all.ok());
  CHECK(all->size() == 60000);
  CHECK(LoadFashionMnistLabels("/nonexistent", Split::kTrain).status().code() == copse::StatusCode::kNotFound);
}

TEST_CASE("Dataset.CorruptedFilesGiveClearErrors") {
  const std::string img = TempPath("img.gz"), lab = TempPath("lab.gz");
  const std::string pixels(2 * 4 * 4, '\x10');
  WriteGz(img, Be32(0x803) + Be32(2) + Be32(4) + Be32(4) + pixels);
  WriteGz(lab, Be32(0x801) + Be32(2) + std::string{1, 2});
  auto ok = ReadIdx(img, lab);
  REQUIRE(ok.ok());
  CHECK(ok->size() == 2);

  WriteGz(img, Be32(0x802) + Be32(2) + Be32(4) + Be32(4) + pixels);
  auto bad_magic = ReadIdx(img, lab);
  CHECK(bad_magic.status().code() == copse::StatusCode::kDataLoss);
  CHECK(bad_magic.status().message().find("magic") != std::string::npos);

  WriteGz(img, Be32(0x803) + Be32(3) + Be32(4) + Be32(4) + pixels);  // header says 3 images
  CHECK(ReadIdx(img, lab).status().message().find("header says 3 images") != std::string::npos);

  WriteGz(img, Be32(0x803) + Be32(2) + Be32(4) + Be32(4) + pixels);
  WriteGz(lab, Be32(0x801) + Be32(2) + std::string{1, 12});  // label 12
  CHECK(ReadIdx(img, lab).status().message().find("label 12") != std::string::npos);

  {  // a gzip stream cut in the middle
    std::ofstream f(lab, std::ios::binary);
    f << std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\x63\x60", 12);
  }
  CHECK(ReadIdx(img, lab).status().code() == copse::StatusCode::kDataLoss);
  CHECK(ReadIdx(img, TempPath("missing.gz")).status().code() == copse::StatusCode::kNotFound);
  std::filesystem::remove(img);
  std::filesystem::remove(lab);
}

TEST_CASE("Dataset.EpochOrderIsADeterministicPermutation") {
  const auto a = EpochOrder(1000, 7, 1), b = EpochOrder(1000, 7, 1), c = EpochOrder(1000, 7, 2);
  CHECK(a == b);
  CHECK(a != c);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) CHECK(sorted[static_cast<size_t>(i)] == i);
}

TEST_CASE("Dataset.ShardsAndBatchesCoverEverythingOnce") {
  const auto order = EpochOrder(103, 1, 0);
  std::vector<int64_t> all;
  for (int r = 0; r < 4; ++r) {
    auto shard = ShardIndices(order, r, 4);
    CHECK(shard.size() >= 25);
    all.insert(all.end(), shard.begin(), shard.end());
  }
  std::sort(all.begin(), all.end());
  CHECK(all.size() == 103);
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());

  const auto batches = MakeBatches(order, 32);
  CHECK(batches.size() == 4);
  CHECK(batches.back().size() == 7);
  CHECK(MakeBatches(order, 32, true).size() == 3);
  std::vector<int64_t> joined;
  for (int r = 0; r < 3; ++r) {
    auto part = ShardBatch(batches[0], r, 3);
    joined.insert(joined.end(), part.begin(), part.end());
  }
  CHECK(joined == batches[0]);

  Batch b;
  b.images = Tensor::Zeros({10, 1, 2, 2});
  b.labels = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  auto micro = SplitMicroBatches(b, 3);
  REQUIRE(micro.size() == 3);
  CHECK(micro[0].size() == 4);
  CHECK(micro[2].labels == std::vector<int32_t>{7, 8, 9});
  CHECK(micro[2].images.shape() == Shape{3, 1, 2, 2});
}
