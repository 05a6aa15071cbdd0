#pragma once
// Text for the language models: a corpus Debian ships (the `fortunes` package: about 2.5 MB of
// English quotations, jokes and definitions in %-separated entries), a byte-level tokenizer and
// the windows a model trains on. Why this corpus: it is real English prose in many voices,
// large enough for a small GPT to learn words and punctuation in minutes on two cores, small
// enough to load in milliseconds, and installed by one package on every machine copse tests
// on (docs/ml.md).
//
//   TextCorpus c = *LoadFortunes(kFortunesDir);               // train and validation text
//   Dataset train = *TextWindows(c.train, /*context=*/64);     // [N, 64] ids, N * 64 targets
//
// Tokens are bytes (vocab 256): no vocabulary file, every byte sequence encodes, and a token id
// is the byte itself. The split is deterministic: entry i of the corpus (files in name order,
// entries in file order) is validation text when i % 10 == 9, training text otherwise.
// Stateless; thread-safe.
#include <cstdint>
#include <string>
#include <vector>

#include "ml/dataset.h"

namespace copse::ml {

constexpr const char* kFortunesDir = "/usr/share/games/fortunes";
constexpr int kByteVocab = 256;

struct TextCorpus {
  std::string train;
  std::string validation;
  int64_t entries = 0;
  int files = 0;
};

/// Reads every fortune file of `dir` — regular files whose names have no dot, fortune's layout
/// (the .dat indexes and .u8 links are skipped, as are symbolic links) — and splits its entries.
/// NotFound when the directory cannot be read or has none, naming the package.
Result<TextCorpus> LoadFortunes(const std::string& dir);

/// Training examples from `text`: window i holds bytes [i * context, (i + 1) * context) as the
/// input ids [N, context] and the bytes one position later as its `context` labels. The first
/// `limit` windows when limit >= 0. InvalidArgument when the text is shorter than one window,
/// saying how long each is.
Result<Dataset> TextWindows(const std::string& text, int context, int64_t limit = -1);

/// The corpus of `dir` split and cut into windows; cached per (dir, context) for the process.
Result<Dataset> LoadTextSplit(const std::string& dir, Split split, int context, int64_t limit = -1);

/// Bytes as token ids and back.
std::vector<float> EncodeBytes(const std::string& text);
std::string DecodeBytes(const std::vector<int32_t>& ids);

}  // namespace copse::ml
