// Word count: text.read_lines -> text.count_words -> text.merge_counts.
//
// text.read_lines   params.path: a text file (relative paths resolve against the job's
//                   directory). Each line goes to output hash(line) % outputs, batched into
//                   messages of about 64 KiB, so any number of counters may follow.
// text.count_words  counts whitespace-separated words over every input; writes "word\tcount\n"
//                   lines sorted by word to every output.
// text.merge_counts sums "word\tcount" lines over every input; writes them sorted by word.
#include <charconv>
#include <fstream>
#include <map>

#include <xxhash.h>

#include "vertex/program_registry.h"

namespace copse::vertex {
namespace {

constexpr size_t kBatchBytes = 64 * 1024;
constexpr size_t kReadBytes = 1 << 20;

class ReadLines final : public VertexProgram {
 public:
  Status CheckParams(const Json& params) const override {
    if (!params.contains("path") || !params["path"].is_string()) {
      return Status::InvalidArgument("params.path (a string) is required");
    }
    return Status::OK();
  }

  Status Run(VertexContext& ctx) override {
    COPSE_RETURN_NOT_OK(CheckParams(ctx.params ? *ctx.params : Json::object()).WithContext(ctx.name));
    auto path = ctx.ResolvePath((*ctx.params)["path"].get<std::string>());
    std::ifstream in(path, std::ios::binary);
    if (!in) return Status::NotFound(ctx.name + ": cannot open " + path.string());
    const size_t n = ctx.num_outputs();
    std::vector<std::string> batches(n);
    // Read a chunk at a time, not a line: a file without line breaks (a device such as
    // /dev/zero, a binary file) would otherwise grow one line without end, beyond the reach of
    // both cancellation and the memory limit.
    std::string chunk(kReadBytes, '\0'), line;
    int64_t line_charged = 0;  // line's capacity, accounted: it keeps it once cleared
    auto emit = [&](std::string_view text) -> Status {
      if (n == 0) return Status::OK();
      const size_t out = XXH3_64bits(text.data(), text.size()) % n;
      batches[out] += text;
      batches[out] += '\n';
      if (batches[out].size() < kBatchBytes) return Status::OK();
      COPSE_RETURN_NOT_OK(ctx.output(out).Write(chan::Buffer(std::move(batches[out]))));
      batches[out].clear();
      return Status::OK();
    };
    while (in) {
      if (ctx.cancelled()) return Status::Cancelled(ctx.name + " cancelled");
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      std::string_view data(chunk.data(), static_cast<size_t>(in.gcount()));
      for (size_t nl; (nl = data.find('\n')) != std::string_view::npos; data.remove_prefix(nl + 1)) {
        if (line.empty()) {
          COPSE_RETURN_NOT_OK(emit(data.substr(0, nl)));
        } else {
          line.append(data.substr(0, nl));
          COPSE_RETURN_NOT_OK(emit(line));
          line.clear();
        }
      }
      // The start of a line that goes on in the next chunk: held, and accounted.
      line.append(data);
      const int64_t capacity = static_cast<int64_t>(line.capacity());
      if (Status st = ctx.ChargeMemory(capacity - line_charged); !st.ok()) {
        return Status::ResourceExhausted(st.message() + "; " + path.string() + " has a line longer than that");
      }
      line_charged = capacity;
    }
    if (in.bad()) return Status::IOError(ctx.name + ": error reading " + path.string());
    if (!line.empty()) COPSE_RETURN_NOT_OK(emit(line));  // the last line, without its line break
    for (size_t i = 0; i < n; ++i) {
      if (!batches[i].empty()) COPSE_RETURN_NOT_OK(ctx.output(i).Write(chan::Buffer(std::move(batches[i]))));
    }
    return ctx.CloseOutputs();
  }
};

using Counts = std::map<std::string, int64_t, std::less<>>;

Status WriteCounts(VertexContext& ctx, const Counts& counts) {
  std::string batch;
  for (const auto& [word, count] : counts) {
    batch += word;
    batch += '\t';
    batch += std::to_string(count);
    batch += '\n';
    if (batch.size() >= kBatchBytes) {
      COPSE_RETURN_NOT_OK(ctx.WriteAll(chan::Buffer(std::move(batch))));
      batch.clear();
    }
  }
  if (!batch.empty()) COPSE_RETURN_NOT_OK(ctx.WriteAll(chan::Buffer(std::move(batch))));
  return ctx.CloseOutputs();
}

/// Calls fn(message) for every message of every input, in port order.
template <typename Fn>
Status ForEachInput(VertexContext& ctx, Fn&& fn) {
  for (size_t port = 0; port < ctx.num_inputs(); ++port) {
    while (true) {
      if (ctx.cancelled()) return Status::Cancelled(ctx.name + " cancelled");
      COPSE_ASSIGN_OR_RETURN(auto msg, ctx.input(port).Next());
      if (!msg) break;
      COPSE_RETURN_NOT_OK(fn(port, msg->view()));
    }
  }
  return Status::OK();
}

/// What one more word costs a count table: its text and a tree node (accounted, as an estimate,
/// against the vertex's memory limit).
int64_t EntryBytes(std::string_view word) { return static_cast<int64_t>(word.size() + 80); }

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class CountWords final : public VertexProgram {
 public:
  Status Run(VertexContext& ctx) override {
    Counts counts;
    COPSE_RETURN_NOT_OK(ForEachInput(ctx, [&](size_t, std::string_view text) {
      size_t i = 0;
      while (i < text.size()) {
        while (i < text.size() && IsSpace(text[i])) ++i;
        size_t start = i;
        while (i < text.size() && !IsSpace(text[i])) ++i;
        if (i > start) {
          auto word = text.substr(start, i - start);
          auto it = counts.find(word);
          if (it != counts.end()) {
            ++it->second;
            continue;
          }
          COPSE_RETURN_NOT_OK(ctx.ChargeMemory(EntryBytes(word)));
          counts.emplace(std::string(word), 1);
        }
      }
      return Status::OK();
    }));
    return WriteCounts(ctx, counts);
  }
};

class MergeCounts final : public VertexProgram {
 public:
  Status Run(VertexContext& ctx) override {
    Counts counts;
    COPSE_RETURN_NOT_OK(ForEachInput(ctx, [&](size_t port, std::string_view text) {
      size_t pos = 0;
      while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string_view::npos) end = text.size();
        auto line = text.substr(pos, end - pos);
        pos = end + 1;
        if (line.empty()) continue;
        size_t tab = line.rfind('\t');
        int64_t n = 0;
        if (tab == std::string_view::npos ||
            std::from_chars(line.data() + tab + 1, line.data() + line.size(), n).ec != std::errc()) {
          return Status::InvalidArgument(ctx.name + ": input " + std::to_string(port) +
                                         " has a line that is not \"word<TAB>count\": " + std::string(line.substr(0, 80)));
        }
        const auto word = line.substr(0, tab);
        auto it = counts.find(word);
        if (it == counts.end()) {
          COPSE_RETURN_NOT_OK(ctx.ChargeMemory(EntryBytes(word)));
          it = counts.emplace(std::string(word), 0).first;
        }
        it->second += n;
      }
      return Status::OK();
    }));
    return WriteCounts(ctx, counts);
  }
};

}  // namespace

void RegisterTextPrograms(ProgramRegistry& registry) {
  (void)registry.Register("text.read_lines", [] { return std::make_unique<ReadLines>(); });
  (void)registry.Register("text.count_words", [] { return std::make_unique<CountWords>(); });
  (void)registry.Register("text.merge_counts", [] { return std::make_unique<MergeCounts>(); });
}

}  // namespace copse::vertex
