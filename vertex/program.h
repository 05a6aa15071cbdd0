#pragma once
// The vertex program API: what a user implements to run code as a vertex.
//
//   class Upper : public copse::vertex::VertexProgram {
//    public:
//     copse::Status Run(copse::vertex::VertexContext& ctx) override {
//       while (true) {
//         COPSE_ASSIGN_OR_RETURN(auto msg, ctx.input(0).Next());
//         if (!msg) break;
//         COPSE_RETURN_NOT_OK(ctx.output(0).Write(Transform(*msg)));
//       }
//       return ctx.CloseOutputs();
//     }
//   };
//   registry.Register("my.upper", [] { return std::make_unique<Upper>(); });
//
// A program must be deterministic given (params, inputs, replica): recovery re-runs it and
// expects the same bytes. Returning an error or throwing fails the attempt (the host catches
// exceptions); it never takes the daemon down. Outputs not closed by the program are closed
// by the host after a successful Run. An error is retried up to the stage's max_attempts,
// unless its code says it would come back on every attempt (IsDeterministicError): bad params
// or input data (InvalidArgument), a file that is not there (NotFound). The job then fails at
// once, as Kubernetes' podFailurePolicy FailJob does for the exit codes it lists.
#include <atomic>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <spdlog/logger.h>

#include "channels/channel.h"
#include "common/json_util.h"

namespace copse::vertex {

class AttemptLog;

/// A collective group over the GPU vertices of this vertex's gang that `nccl` channels join
/// (ranks in vertex-id order). Owned by the host for the duration of Run.
class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// In-place sum of `count` host floats over every member; every member must call it.
  virtual Status AllReduceSum(float* data, size_t count) = 0;
};

/// A param of the wrong type (VertexContext::param): the host reports it as the vertex's
/// error, named, instead of an exception thrown from inside the program.
class ParamError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

template <typename T>
const char* ParamTypeName() {
  if constexpr (std::is_same_v<T, bool>)
    return "true or false";
  else if constexpr (std::is_arithmetic_v<T>)
    return "a number";
  else if constexpr (std::is_convertible_v<T, std::string>)
    return "a string";
  else
    return "another type";
}

/// Everything one execution (one version) of a vertex may use. Owned by the host; valid for
/// the duration of Run.
class VertexContext {
 public:
  std::string name;  // "count[1]"
  int replica = 0;
  uint32_t version = 0;  // execution number; outputs carry it
  const Json* params = nullptr;
  std::vector<chan::ChannelReader*> inputs;   // by input port
  std::vector<chan::ChannelWriter*> outputs;  // by output port
  const std::atomic<bool>* cancel_flag = nullptr;
  /// Where this attempt's own output goes (`copse logs JOB VERTEX`); set by the host.
  AttemptLog* attempt_log = nullptr;
  std::filesystem::path scratch_dir;  // private directory; see MakeScratchDir()
  std::filesystem::path job_dir;      // the submitted job file's directory
  unsigned threads = 1;               // cpus granted to this vertex
  int gpu = -1;                       // the CUDA device granted to it (resources.gpus > 0)
  Collective* collective = nullptr;   // with nccl channels: the gang's group
  /// The memory this vertex may hold: its stage's resources.memory_mb, else its cpus' share of
  /// what its daemon offers; 0: unbounded. Programs account what they buffer with ChargeMemory; `exec` children
  /// get it as their address-space limit when the stage declares it.
  int64_t memory_limit_bytes = 0;
  /// Whether the stage declared resources.memory_mb (the limit is then the vertex's own).
  bool memory_declared = false;
  /// What a successful attempt tells about the job's progress: a small JSON object (a training
  /// update sets {"step", "steps", "loss", "images"}). It travels with the attempt's report and
  /// shows in `copse status` / `copse run` while the job runs.
  Json progress;

  chan::ChannelReader& input(size_t port) { return *inputs.at(port); }
  chan::ChannelWriter& output(size_t port) { return *outputs.at(port); }
  size_t num_inputs() const { return inputs.size(); }
  size_t num_outputs() const { return outputs.size(); }
  bool cancelled() const { return cancel_flag && cancel_flag->load(std::memory_order_relaxed); }
  /// params[key] or `fallback` when absent; throws ParamError naming the key when it holds
  /// another type (`"batch": "64"`).
  template <typename T>
  T param(const char* key, T fallback) const {
    if (!params || !params->contains(key)) return fallback;
    const Json& value = (*params)[key];
    try {
      return value.get<T>();
    } catch (const Json::exception&) {
      throw ParamError(std::string("param \"") + key + "\": expected " + ParamTypeName<T>() + ", got " + DumpJson(value));
    }
  }
  /// Creates scratch_dir (removed by the host after the attempt) and returns it. Most programs
  /// never need one, so the host creates none up front.
  Result<std::filesystem::path> MakeScratchDir();
  bool scratch_created() const { return scratch_created_; }
  /// `path` as given when absolute, else relative to the job file's directory.
  std::filesystem::path ResolvePath(const std::string& path) const;
  /// Closes every output (end of stream).
  Status CloseOutputs();
  /// Writes `message` to every output.
  Status WriteAll(const chan::Buffer& message);
  /// Accounts `delta` bytes more (or fewer, when negative) that the program holds: what it
  /// buffers of its inputs, tables it builds. Fails the attempt, as Spark fails a task that
  /// cannot acquire execution memory, with ResourceExhausted naming the vertex, the limit and
  /// where it comes from, once the total passes memory_limit_bytes; the program returns that
  /// error. A runaway vertex (a "line" of /dev/zero) fails alone instead of taking its daemon
  /// and every vertex beside it down with it.
  Status ChargeMemory(int64_t delta);
  int64_t memory_charged() const { return memory_charged_; }
  /// This attempt's logger: its lines (info and above, as `HH:MM:SS.mmm level text`) are kept
  /// with the attempt and shown by `copse logs JOB VERTEX`, as a task's prints are in Ray or
  /// Spark. Made on first use.
  spdlog::logger& log();

 private:
  std::shared_ptr<spdlog::logger> logger_;
  bool scratch_created_ = false;
  int64_t memory_charged_ = 0;
};

/// Whether a program's error repeats on every attempt, so retrying it is pointless. Errors
/// reading an input are the host's to judge (the input may be regenerated), never these.
inline bool IsDeterministicError(StatusCode code) {
  return code == StatusCode::kInvalidArgument || code == StatusCode::kNotFound;
}

class VertexProgram {
 public:
  virtual ~VertexProgram() = default;
  virtual Status Run(VertexContext& ctx) = 0;
  /// What validating a job file can tell about a stage's `params` (an object; placeholders such
  /// as `{replica}` not yet expanded) before any vertex runs: required members and their types.
  /// InvalidArgument saying what is wrong; Run makes the same checks.
  virtual Status CheckParams(const Json& /*params*/) const { return Status::OK(); }
};

}  // namespace copse::vertex
