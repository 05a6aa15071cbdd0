#include "cli/trace_client.h"

#include <filesystem>
#include <fstream>

namespace copse::cli {

Result<Json> ReceiveTrace(net::BlockingClient& client, uint64_t job, const std::function<void(const Json& event)>& on_event) {
  COPSE_RETURN_NOT_OK(client.Send({{"op", "trace"}, {"job", job}}));
  while (true) {
    COPSE_ASSIGN_OR_RETURN(Json part, client.Receive());
    const std::string op = StringMember(part, "op");
    if (op == "trace") {
      part.erase("op");
      return part;
    }
    if (op != "trace_part" || !part.contains("events") || !part["events"].is_array()) {
      return Status::Internal("unexpected message in a trace: " + DumpJson(part).substr(0, 200));
    }
    for (const Json& event : part["events"]) on_event(event);
  }
}

Status WriteTrace(net::BlockingClient& client, uint64_t job, std::ostream& out) {
  out << "{\"traceEvents\":[";
  bool first = true;
  auto trailer = ReceiveTrace(client, job, [&](const Json& event) {
    out << (first ? "" : ",") << DumpJson(event);
    first = false;
  });
  if (!trailer.ok()) return trailer.status();
  out << ']';
  for (const auto& [key, value] : trailer->items()) out << "," << DumpJson(Json(key)) << ":" << DumpJson(value);
  out << "}\n";
  out.flush();
  return out ? Status::OK() : Status::IOError("cannot write the trace");
}

Status WriteTraceFile(net::BlockingClient& client, uint64_t job, const std::string& path) {
  std::ofstream file(path);
  if (!file) return Status::IOError("cannot write " + path);
  Status st = WriteTrace(client, job, file);
  if (st.ok()) return st;
  file.close();
  std::error_code ec;
  std::filesystem::remove(path, ec);
  return st.code() == StatusCode::kIOError ? Status::IOError("cannot write " + path) : st;
}

}  // namespace copse::cli
