#include "protocol/checks.h"

#include <string>

#include "protocol/keys.h"

namespace copse::protocol {
namespace {

/// Builds the error for the first rule broken, naming the field by its path in the message.
class Checker {
 public:
  explicit Checker(std::string root) : path_(std::move(root)) {}

  /// Runs `body` with `field` appended to the path ("Run" + "tasks[2]" -> "Run.tasks[2]").
  template <class F>
  void In(const std::string& field, F&& body) {
    if (!status_.ok()) return;
    const size_t size = path_.size();
    path_ += "." + field;
    body();
    path_.resize(size);
  }
  void Fail(const std::string& field, const std::string& why) {
    if (status_.ok()) status_ = Status::InvalidArgument(path_ + "." + field + ": " + why);
  }
  void Require(bool ok, const std::string& field, const std::string& why) {
    if (!ok) Fail(field, why);
  }
  template <class T>
  void Range(T value, T lo, T hi, const std::string& field) {
    if (value < lo || value > hi)
      Fail(field, "must be " + std::to_string(lo) + " to " + std::to_string(hi) + ", got " + std::to_string(value));
  }
  bool ok() const { return status_.ok(); }
  Status status() const { return status_; }

 private:
  std::string path_;
  Status status_;
};

std::string Index(const char* field, int i) { return std::string(field) + "[" + std::to_string(i) + "]"; }

bool IsLiveKind(ChannelKind kind) { return kind == CHANNEL_STREAM || kind == CHANNEL_SHM || kind == CHANNEL_NCCL; }

void CheckRegister(Checker& c, const Register& m) {
  c.Require(!m.name().empty(), "name", "required");
  c.Require(m.cpus() >= 0 && m.cpus() <= 1e6, "cpus", "must be 0 to 1,000,000, got " + std::to_string(m.cpus()));
  c.Range<int64_t>(m.gpus(), 0, 1'000'000, "gpus");
  c.Require(m.memory_mb() >= 0, "memory_mb", "must not be negative");
  c.Require(m.gpu_memory_mb() >= 0, "gpu_memory_mb", "must not be negative");
  c.Require(!m.data_host().empty(), "data_host", "required");
  c.Range<uint32_t>(m.data_port(), 1, 65535, "data_port");
  // Producers address live channels to it there: an empty one would fail their tasks.
  c.Require(m.stream().tcp().rfind("tcp://", 0) == 0, "stream.tcp", "required (\"tcp://host:port\")");
}

void CheckReport(Checker& c, const Report& m) {
  c.Require(m.attempts_size() > 0, "attempts", "at least one attempt");
  for (int i = 0; i < m.attempts_size() && c.ok(); ++i) {
    const AttemptReport& a = m.attempts(i);
    c.In(Index("attempts", i), [&] {
      c.Require(a.version() >= 1, "version", "required (>= 1)");
      if (!a.ok()) {
        c.Require(
            a.failure() == FAILURE_PROGRAM_ERROR || a.failure() == FAILURE_INPUT_LOST || a.failure() == FAILURE_CANCELLED,
            "failure",
            "a failed attempt needs program_error, input_lost or cancelled, got " + std::string(FailureClassName(a.failure())));
      }
      c.Require(a.duration_ms() >= 0, "duration_ms", "must not be negative");
      c.Require(a.output_bytes_size() == a.output_messages_size(), "output_messages", "one per output port, as output_bytes");
    });
  }
}

void CheckTask(Checker& c, const Task& t) {
  c.Require(t.version() >= 1, "version", "required (>= 1)");
  c.Require(!t.name().empty(), "name", "required");
  c.Require(!t.program().empty(), "program", "required");
  c.Require(t.threads() >= 1, "threads", "required (>= 1)");
  c.Require(t.memory_mb() >= 0, "memory_mb", "must not be negative");
  c.Range<int64_t>(t.delay_ms(), 0, 86'400'000, "delay_ms");
  for (int i = 0; i < t.inputs_size() && c.ok(); ++i) {
    const Input& in = t.inputs(i);
    c.In(Index("inputs", i), [&] {
      switch (in.source_case()) {
        case Input::kEmpty: break;
        case Input::kStored:
          c.In("stored", [&] {
            c.Require(in.stored().has_key(), "key", "required");
            c.Require(in.stored().has_store() || !in.stored().durable().empty(), "store",
                      "required unless a durable copy is named");
            if (in.stored().has_store() && !in.stored().store().local()) {
              c.In("store", [&] {
                c.Require(!in.stored().store().host().empty(), "host", "required when not local");
                c.Range<uint32_t>(in.stored().store().port(), 1, 65535, "port");
              });
            }
          });
          break;
        case Input::kLive:
          c.In("live", [&] {
            c.Require(IsLiveKind(in.live().kind()), "kind", "must be stream, shm or nccl");
            c.Require(in.live().has_key(), "key", "required");
          });
          break;
        default: c.Fail("source", "required (empty, stored or live)");
      }
    });
  }
  for (int i = 0; i < t.outputs_size() && c.ok(); ++i) {
    const Output& out = t.outputs(i);
    c.In(Index("outputs", i), [&] {
      switch (out.sink_case()) {
        case Output::kStored:
          c.Require(out.stored() == CHANNEL_FILE || out.stored() == CHANNEL_MEMORY, "stored", "must be file or memory");
          break;
        case Output::kDurable: c.Require(!out.durable().empty(), "durable", "a path is required"); break;
        case Output::kLive:
          c.In("live", [&] {
            c.Require(IsLiveKind(out.live().kind()), "kind", "must be stream, shm or nccl");
            c.Require(out.live().channels_size() > 0, "channels", "at least one");
            for (int j = 0; j < out.live().channels_size(); ++j) {
              const LiveChannel& ch = out.live().channels(j);
              c.In(Index("channels", j), [&] {
                c.Require(ch.has_key(), "key", "required");
                if (out.live().kind() == CHANNEL_STREAM) c.Require(!ch.peer().tcp().empty(), "peer.tcp", "required for stream");
              });
            }
          });
          break;
        default: c.Fail("sink", "required (stored, durable or live)");
      }
    });
  }
  if (t.has_nccl()) {
    c.In("nccl", [&] {
      c.Require(!t.nccl().group().empty(), "group", "required");
      c.Range<int32_t>(t.nccl().nranks(), 1, 1'000'000, "nranks");
      if (c.ok()) c.Range<int32_t>(t.nccl().rank(), 0, t.nccl().nranks() - 1, "rank");
    });
  }
  int remote = 0;
  for (int i = 0; i < t.after_size() && c.ok(); ++i) {
    c.In(Index("after", i), [&] { c.Require(t.after(i).version() >= 1, "version", "required (>= 1)"); });
    remote += t.after(i).remote();
  }
  c.Require(remote <= 1, "after", "at most one attempt on another daemon");
}

/// A job id a journal may name (protocol/journal.proto).
void CheckJobId(Checker& c, uint64_t job, const char* field) { c.Range<uint64_t>(job, 1, kLargestJobId, field); }

void CheckJobEnded(Checker& c, const JobEnded& m) {
  CheckJobId(c, m.job(), "job");
  c.Require(m.state() == JOB_COMPLETED || m.state() == JOB_FAILED || m.state() == JOB_CANCELLED, "state",
            "must be COMPLETED, FAILED or CANCELLED, got " + std::to_string(m.state()));
  // Its elapsed time, faults and recoveries are shown as they are (the restore ignores an
  // elapsed time it cannot use): an odd one must not cost the job its end.
}

}  // namespace

Status Check(const JournalRecord& m) {
  Checker c("JournalRecord");
  switch (m.body_case()) {
    case JournalRecord::kJob:
      c.In("job", [&] {
        CheckJobId(c, m.job().job(), "job");
        c.Require(!m.job().doc_json().empty(), "doc_json", "required");
      });
      break;
    case JournalRecord::kDone:
      c.In("done", [&] {
        CheckJobId(c, m.done().job(), "job");
        c.Require(m.done().version() >= 1, "version", "required (>= 1)");
        c.Require(!m.done().daemon().empty(), "daemon", "required");
      });
      break;
    case JournalRecord::kRegen: c.In("regen", [&] { CheckJobId(c, m.regen().job(), "job"); }); break;
    case JournalRecord::kEnd: c.In("end", [&] { CheckJobEnded(c, m.end()); }); break;
    case JournalRecord::kIds: c.In("ids", [&] { CheckJobId(c, m.ids().up_to(), "up_to"); }); break;
    case JournalRecord::kRestart: break;
    default:
      // Unlike a notice between peers, a record of a kind this build does not know cannot be
      // ignored: what it said would be lost.
      c.Fail("body", m.GetReflection()->GetUnknownFields(m).empty() ? "empty" : "a kind of record this copse does not know");
  }
  return c.status();
}

Status Check(const DaemonToJm& m) {
  Checker c("DaemonToJm");
  switch (m.body_case()) {
    case DaemonToJm::kRegister: c.In("register", [&] { CheckRegister(c, m.register_()); }); break;
    case DaemonToJm::kHeartbeat: break;
    case DaemonToJm::kReport: c.In("report", [&] { CheckReport(c, m.report()); }); break;
    case DaemonToJm::kVertexLog:
      c.In("vertex_log", [&] { c.Require(m.vertex_log().version() >= 1, "version", "required (>= 1)"); });
      break;
    case DaemonToJm::kMirrored:
      c.In("mirrored", [&] {
        c.Require(m.mirrored().has_key(), "key", "required");
        c.Require(m.mirrored().ok() || !m.mirrored().error().empty(), "error", "required when not ok");
      });
      break;
    case DaemonToJm::kNcclId:
      c.In("nccl_id", [&] {
        c.Require(!m.nccl_id().group().empty(), "group", "required");
        c.Require(!m.nccl_id().id().empty(), "id", "required");
      });
      break;
    default:
      // A kind this build does not know (a newer peer's) parses with no body set and its
      // fields kept as unknown: let it through, to be ignored. Nothing at all is an error.
      if (m.GetReflection()->GetUnknownFields(m).empty()) c.Fail("body", "empty");
  }
  return c.status();
}

Status Check(const JmToDaemon& m) {
  Checker c("JmToDaemon");
  switch (m.body_case()) {
    case JmToDaemon::kRegistered:
      c.In("registered", [&] { c.Range<uint32_t>(m.registered().heartbeat_ms(), 1, 60'000, "heartbeat_ms"); });
      break;
    case JmToDaemon::kRun:
      c.In("run", [&] {
        c.Require(m.run().tasks_size() > 0, "tasks", "at least one task");
        for (int i = 0; i < m.run().tasks_size() && c.ok(); ++i) c.In(Index("tasks", i), [&] { CheckTask(c, m.run().tasks(i)); });
      });
      break;
    case JmToDaemon::kCancel:
    case JmToDaemon::kGc:
    case JmToDaemon::kRelease:
    case JmToDaemon::kKill: break;
    case JmToDaemon::kPeerLost:
      c.In("peer_lost", [&] {
        c.Require(!m.peer_lost().host().empty(), "host", "required");
        c.Range<uint32_t>(m.peer_lost().port(), 1, 65535, "port");
      });
      break;
    case JmToDaemon::kNcclId:
      c.In("nccl_id", [&] {
        c.Require(!m.nccl_id().group().empty(), "group", "required");
        c.Require(!m.nccl_id().id().empty(), "id", "required");
      });
      break;
    case JmToDaemon::kMirror:
      c.In("mirror", [&] {
        c.Require(m.mirror().has_key(), "key", "required");
        c.Require(m.mirror().has_from() && !m.mirror().from().host().empty(), "from", "required (a data server's host)");
        if (m.mirror().has_from()) c.In("from", [&] { c.Range<uint32_t>(m.mirror().from().port(), 1, 65535, "port"); });
      });
      break;
    case JmToDaemon::kCut: c.In("cut", [&] { c.Range<int64_t>(m.cut().ms(), 0, 86'400'000, "ms"); }); break;
    case JmToDaemon::kDamage:
      c.In("damage", [&] {
        c.Require(m.damage().damage() == DamageOutputs::CORRUPT || m.damage().damage() == DamageOutputs::DROP, "damage",
                  "must be CORRUPT or DROP");
      });
      break;
    default:
      if (m.GetReflection()->GetUnknownFields(m).empty()) c.Fail("body", "empty");
  }
  return c.status();
}

Status Check(const DataRequest& m) {
  Checker c("DataRequest");
  switch (m.body_case()) {
    case DataRequest::kFetch: c.In("fetch", [&] { c.Require(m.fetch().has_key(), "key", "required"); }); break;
    case DataRequest::kPing: break;
    default:
      // A request this build does not know cannot be answered: unlike a notice, it is refused.
      c.Fail("body", m.GetReflection()->GetUnknownFields(m).empty() ? "empty" : "a request this data server does not know");
  }
  return c.status();
}

Status Check(const DataReply& m) {
  Checker c("DataReply");
  if (m.body_case() == DataReply::BODY_NOT_SET) c.Fail("body", "empty");
  return c.status();
}

Status Check(const FetchEnd& m) {
  Checker c("FetchEnd");
  if (m.ok()) {
    c.Require(m.code().empty(), "code", "must be empty when ok");
  } else {
    c.Require(!m.code().empty(), "code", "required when not ok");
    c.Require(!m.handoff(), "handoff", "only when ok");
  }
  return c.status();
}

}  // namespace copse::protocol
