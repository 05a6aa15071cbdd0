#include <algorithm>
#include <mutex>

#include <fmt/format.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/null_sink.h>

#include "vertex/attempt_log.h"
#include "vertex/program.h"

namespace copse::vertex {
namespace {

/// Formats a program's log lines into its attempt's log.
class AttemptLogSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit AttemptLogSink(AttemptLog& log) : log_(log) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    log_.Append("log", std::string_view(formatted.data(), formatted.size()));
  }
  void flush_() override {}

 private:
  AttemptLog& log_;
};

}  // namespace

spdlog::logger& VertexContext::log() {
  if (!logger_) {
    spdlog::sink_ptr sink = attempt_log ? spdlog::sink_ptr(std::make_shared<AttemptLogSink>(*attempt_log))
                                        : spdlog::sink_ptr(std::make_shared<spdlog::sinks::null_sink_mt>());
    sink->set_pattern("%H:%M:%S.%e %l %v");
    logger_ = std::make_shared<spdlog::logger>(name, std::move(sink));
    logger_->set_level(spdlog::level::info);
  }
  return *logger_;
}

std::filesystem::path VertexContext::ResolvePath(const std::string& path) const {
  std::filesystem::path p(path);
  return p.is_relative() && !job_dir.empty() ? job_dir / p : p;
}

Result<std::filesystem::path> VertexContext::MakeScratchDir() {
  std::error_code ec;
  std::filesystem::create_directories(scratch_dir, ec);
  if (ec) return Status::IOError(name + ": cannot create " + scratch_dir.string() + ": " + ec.message());
  scratch_created_ = true;
  return scratch_dir;
}

Status VertexContext::ChargeMemory(int64_t delta) {
  memory_charged_ = std::max<int64_t>(0, memory_charged_ + delta);
  if (memory_limit_bytes <= 0 || memory_charged_ <= memory_limit_bytes) return Status::OK();
  return Status::ResourceExhausted(fmt::format(
      "{} needs more than its {} of {} MB (it holds {} MB): declare more, or give it less to hold at once", name,
      memory_declared ? "resources.memory_mb" : "share of its daemon's memory (its stage declares no resources.memory_mb)",
      memory_limit_bytes >> 20, memory_charged_ >> 20));
}

Status VertexContext::CloseOutputs() {
  for (auto* out : outputs) COPSE_RETURN_NOT_OK(out->Close());
  return Status::OK();
}

Status VertexContext::WriteAll(const chan::Buffer& message) {
  for (auto* out : outputs) COPSE_RETURN_NOT_OK(out->Write(message));
  return Status::OK();
}

}  // namespace copse::vertex
