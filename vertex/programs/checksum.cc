#include "vertex/programs/checksum.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "vertex/program_registry.h"

namespace copse::vertex {

ChecksumHasher::ChecksumHasher(std::string_view vertex_name, std::string_view params_json) : state_(XXH3_createState()) {
  XXH3_64bits_reset(state_);
  const char zero = 0;
  XXH3_64bits_update(state_, vertex_name.data(), vertex_name.size());
  XXH3_64bits_update(state_, &zero, 1);
  XXH3_64bits_update(state_, params_json.data(), params_json.size());
  XXH3_64bits_update(state_, &zero, 1);
}

ChecksumHasher::~ChecksumHasher() { XXH3_freeState(state_); }

void ChecksumHasher::AddMessage(std::string_view bytes) {
  uint64_t len = bytes.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(len >> (8 * i));
  XXH3_64bits_update(state_, le, 8);
  XXH3_64bits_update(state_, bytes.data(), bytes.size());
}

void ChecksumHasher::EndPort() {
  const unsigned char term[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  XXH3_64bits_update(state_, term, 8);
}

uint64_t ChecksumHasher::Digest() const { return XXH3_64bits_digest(state_); }

std::string DigestLine(uint64_t digest) {
  static const char* kHex = "0123456789abcdef";
  std::string s(17, '\n');
  for (int i = 0; i < 16; ++i) s[i] = kHex[(digest >> (60 - 4 * i)) & 0xf];
  return s;
}

std::string DeterministicBytes(uint64_t digest, size_t n) { return DeterministicBytesAt(digest, 0, n); }

std::string DeterministicBytesAt(uint64_t digest, uint64_t offset, size_t n) {
  std::string out(n, '\0');
  // splitmix64 is counter-based: word k is mix(digest + (k + 1) * golden), so any offset works.
  uint64_t x = digest + (offset / 8) * 0x9e3779b97f4a7c15ULL;
  for (size_t i = 0; i < n; i += 8) {
    x += 0x9e3779b97f4a7c15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    std::memcpy(out.data() + i, &z, std::min<size_t>(8, n - i));
  }
  return out;
}

namespace {

class ChecksumProgram final : public VertexProgram {
 public:
  Status CheckParams(const Json& params) const override {
    for (const char* key : {"sleep_ms", "bytes"}) {
      if (params.contains(key) && !(params[key].is_number_integer() && params[key].get<int64_t>() >= 0)) {
        return Status::InvalidArgument(std::string("params.") + key + " must be a whole number ≥ 0, got " +
                                       DumpJson(params[key]));
      }
    }
    return Status::OK();
  }

  Status Run(VertexContext& ctx) override {
    COPSE_RETURN_NOT_OK(CheckParams(ctx.params ? *ctx.params : Json::object()).WithContext(ctx.name));
    ChecksumHasher hasher(ctx.name, ctx.params ? ctx.params->dump() : "{}");
    for (size_t port = 0; port < ctx.num_inputs(); ++port) {
      while (true) {
        COPSE_ASSIGN_OR_RETURN(auto msg, ctx.input(port).Next());
        if (!msg) break;
        hasher.AddMessage(msg->view());
      }
      hasher.EndPort();
    }
    int64_t sleep_ms = ctx.param<int64_t>("sleep_ms", 0);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(sleep_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      if (ctx.cancelled()) return Status::Cancelled(ctx.name + " cancelled");
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(std::chrono::milliseconds(5),
                                                                                deadline - std::chrono::steady_clock::now()));
    }
    uint64_t digest = hasher.Digest();
    COPSE_RETURN_NOT_OK(ctx.WriteAll(chan::Buffer(DigestLine(digest))));
    int64_t extra = ctx.param<int64_t>("bytes", 0);
    constexpr uint64_t kChunk = 1 << 20;
    for (uint64_t off = 0; off < static_cast<uint64_t>(std::max<int64_t>(extra, 0)); off += kChunk) {
      if (ctx.cancelled()) return Status::Cancelled(ctx.name + " cancelled");
      size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, extra - off));
      COPSE_RETURN_NOT_OK(ctx.WriteAll(chan::Buffer(DeterministicBytesAt(digest, off, n))));
    }
    return ctx.CloseOutputs();
  }
};

class NoopProgram final : public VertexProgram {
 public:
  Status Run(VertexContext& ctx) override {
    for (size_t port = 0; port < ctx.num_inputs(); ++port) {
      while (true) {
        COPSE_ASSIGN_OR_RETURN(auto msg, ctx.input(port).Next());
        if (!msg) break;
      }
    }
    return ctx.CloseOutputs();
  }
};

}  // namespace

void RegisterChecksumPrograms(ProgramRegistry& registry) {
  (void)registry.Register("checksum", [] { return std::make_unique<ChecksumProgram>(); });
  (void)registry.Register("noop", [] { return std::make_unique<NoopProgram>(); });
}

}  // namespace copse::vertex
