#include "ml/text_corpus.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "common/json_util.h"

namespace copse::ml {
namespace {

constexpr int64_t kMaxCorpusBytes = int64_t{1} << 30;  // all files together: 1 GiB is no fortunes directory

/// Entries of a fortune file: text between lines holding a single '%'.
std::vector<std::string> SplitEntries(const std::string& text) {
  std::vector<std::string> out;
  std::string current;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line == "%") {
      if (!current.empty()) out.push_back(std::move(current));
      current.clear();
    } else {
      current += line;
      current += '\n';
    }
  }
  if (!current.empty()) out.push_back(std::move(current));
  return out;
}

}  // namespace

Result<TextCorpus> LoadFortunes(const std::string& dir) {
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  std::filesystem::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    // fortune's layout: text files have no dot in their names (.dat indexes, .u8 links do);
    // links are skipped, so each file counts once.
    const std::string name = it->path().filename().string();
    std::error_code kind;
    if (name.find('.') == std::string::npos && !it->is_symlink(kind) && it->is_regular_file(kind)) files.push_back(it->path());
  }
  if (ec)
    return Status::NotFound(dir + ": " + ec.message() +
                            " (the text corpus is Debian's fortunes package: apt-get install fortunes)");
  if (files.empty())
    return Status::NotFound(dir + ": no fortune files (the text corpus is Debian's fortunes package: apt-get install fortunes)");
  std::sort(files.begin(), files.end());
  TextCorpus c;
  int64_t bytes = 0;
  for (const auto& f : files) {
    COPSE_ASSIGN_OR_RETURN(std::string text, ReadFile(f.string(), static_cast<size_t>(kMaxCorpusBytes - bytes)));
    bytes += static_cast<int64_t>(text.size());
    for (std::string& entry : SplitEntries(text)) {
      std::string& dst = c.entries % 10 == 9 ? c.validation : c.train;
      dst += entry;
      dst += "%\n";
      ++c.entries;
    }
    ++c.files;
  }
  return c;
}

Result<Dataset> TextWindows(const std::string& text, int context, int64_t limit) {
  if (context < 1) return Status::InvalidArgument("context must be >= 1, got " + std::to_string(context));
  const int64_t windows = (static_cast<int64_t>(text.size()) - 1) / context;
  if (windows < 1)
    return Status::InvalidArgument("the text has " + std::to_string(text.size()) + " bytes, fewer than one window of " +
                                   std::to_string(context) + " tokens and its next token needs");
  const int64_t n = limit >= 0 ? std::min(limit, windows) : windows;
  Tensor ids = Tensor::Empty({n, context}, CpuDevice());
  std::vector<int32_t> labels(static_cast<size_t>(n * context));
  float* dst = ids.data();
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  for (int64_t i = 0; i < n * context; ++i) {
    dst[i] = static_cast<float>(bytes[i]);
    labels[static_cast<size_t>(i)] = bytes[i + 1];
  }
  return Dataset(std::move(ids), std::move(labels));
}

Result<Dataset> LoadTextSplit(const std::string& dir, Split split, int context, int64_t limit) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const TextCorpus>> corpora;
  std::shared_ptr<const TextCorpus> corpus;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = corpora.find(dir);
    if (it == corpora.end()) {
      COPSE_ASSIGN_OR_RETURN(TextCorpus c, LoadFortunes(dir));
      it = corpora.emplace(dir, std::make_shared<const TextCorpus>(std::move(c))).first;
    }
    corpus = it->second;
  }
  auto r = TextWindows(split == Split::kTrain ? corpus->train : corpus->validation, context, limit);
  if (!r.ok()) return r.status().WithContext(std::string(split == Split::kTrain ? "training" : "validation") + " text of " + dir);
  return r;
}

std::vector<float> EncodeBytes(const std::string& text) {
  std::vector<float> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<float>(static_cast<unsigned char>(text[i]));
  return out;
}

std::string DecodeBytes(const std::vector<int32_t>& ids) {
  std::string out;
  for (const int32_t id : ids) out += static_cast<char>(static_cast<unsigned char>(id));
  return out;
}

}  // namespace copse::ml
