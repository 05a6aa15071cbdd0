#pragma once
// What the harnesses and the seed generator report for a task a daemon "ran": success, one
// 10-byte message on each output port.
#include "jobmanager/scheduler.h"
#include "protocol/daemon.pb.h"

namespace copse::fuzz {

inline jm::AttemptReport Succeeded(const protocol::Task& task) {
  jm::AttemptReport r;
  r.job = JobId(task.job());
  r.vertex = VertexId(task.vertex());
  r.version = task.version();
  r.ok = true;
  r.output_bytes.assign(task.outputs_size(), 10);
  r.output_messages.assign(task.outputs_size(), 1);
  r.duration_ms = 1.5;
  return r;
}

}  // namespace copse::fuzz
