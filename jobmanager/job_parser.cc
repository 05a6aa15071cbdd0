#include "jobmanager/job_parser.h"

#include <algorithm>
#include <cmath>

#include "common/text_util.h"

namespace copse::jm {
namespace {

constexpr int kMaxReplicas = 10'000'000;

/// Reads the members of one JSON object, reporting type errors and unknown keys.
class ObjectReader {
 public:
  ObjectReader(const Json& obj, std::string pointer, Diagnostics& diags, std::vector<std::string> known)
      : obj_(obj), pointer_(std::move(pointer)), diags_(diags), known_(std::move(known)) {}

  /// False (and one diagnostic) when the value is not an object.
  bool IsObject(std::string_view what) {
    if (obj_.is_object()) return true;
    diags_.Error(pointer_, "expected " + std::string(what) + " (an object), got " + JsonTypeName(obj_));
    return false;
  }

  void RejectUnknownKeys() {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      bool known = false;
      for (const auto& k : known_) known = known || k == it.key();
      if (known) continue;
      std::string msg = "unknown key \"" + it.key() + "\"";
      if (auto guess = DidYouMean(it.key(), known_); !guess.empty()) {
        msg += "; did you mean \"" + guess + "\"?";
      } else {
        msg += "; expected one of: " + Join(known_, ", ");
      }
      diags_.Error(PointerAppend(pointer_, it.key()), msg);
    }
  }

  const Json* Find(std::string_view key) const {
    auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }
  std::string PointerOf(std::string_view key) const { return PointerAppend(pointer_, key); }
  bool Has(std::string_view key) const { return Find(key) != nullptr; }

  std::optional<std::string> String(std::string_view key, bool required) {
    const Json* v = Find(key);
    if (!v) {
      if (required) diags_.Error(pointer_, "missing required key \"" + std::string(key) + "\" (a string)");
      return std::nullopt;
    }
    if (!v->is_string()) {
      diags_.Error(PointerOf(key), "expected a string, got " + JsonTypeName(*v));
      return std::nullopt;
    }
    return v->get<std::string>();
  }

  /// An integer in [lo, hi].
  std::optional<int64_t> Integer(std::string_view key, int64_t lo, int64_t hi, bool required = false) {
    const Json* v = Find(key);
    if (!v) {
      if (required) diags_.Error(pointer_, "missing required key \"" + std::string(key) + "\" (an integer)");
      return std::nullopt;
    }
    return IntegerValue(*v, PointerOf(key), lo, hi);
  }

  std::optional<double> Number(std::string_view key, double lo, double hi) {
    const Json* v = Find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) {
      diags_.Error(PointerOf(key), "expected a number, got " + JsonTypeName(*v));
      return std::nullopt;
    }
    double d = v->get<double>();
    if (!(d >= lo && d <= hi)) {
      diags_.Error(PointerOf(key), "expected a number from " + Fmt(lo) + " to " + Fmt(hi) + ", got " + v->dump());
      return std::nullopt;
    }
    return d;
  }

  std::optional<int64_t> IntegerValue(const Json& v, const std::string& ptr, int64_t lo, int64_t hi) {
    bool integral = v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    if (!integral) {
      diags_.Error(ptr, "expected an integer, got " + (v.is_number() ? v.dump() : JsonTypeName(v)));
      return std::nullopt;
    }
    // A float beyond int64 does not convert (undefined; 1e300 read as -2^63): range-check it first.
    const bool float_out = v.is_number_float() && !(v.get<double>() >= static_cast<double>(lo) &&
                                                    v.get<double>() <= static_cast<double>(hi) && v.get<double>() < 0x1p63);
    if (float_out) {
      diags_.Error(ptr, "expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got " + v.dump());
      return std::nullopt;
    }
    int64_t i =
        v.is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX)) : v.get<int64_t>();
    if (i < lo || i > hi) {
      diags_.Error(ptr,
                   "expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got " + std::to_string(i));
      return std::nullopt;
    }
    return i;
  }

  static std::string Fmt(double d) {
    Json j = d;
    return j.dump();
  }

 private:
  const Json& obj_;
  std::string pointer_;
  Diagnostics& diags_;
  std::vector<std::string> known_;
};

/// [A-Za-z_][A-Za-z0-9_.-]*, checked by hand: std::regex matches by recursion, and a name of
/// some 26,000 characters overflowed the stack.
bool ValidName(const std::string& name) {
  auto alpha = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
  if (name.empty() || !alpha(name[0])) return false;
  return std::all_of(name.begin() + 1, name.end(),
                     [&](char c) { return alpha(c) || (c >= '0' && c <= '9') || c == '.' || c == '-'; });
}

std::optional<EndpointRef> ReadEndpoint(ObjectReader& r, std::string_view key, bool required, Diagnostics& diags) {
  auto text = r.String(key, required);
  if (!text) return std::nullopt;
  auto ref = ParseEndpointRef(*text);
  if (!ref) {
    diags.Error(r.PointerOf(key), "expected a stage name or a vertex name like \"stage[3]\", got \"" + *text + "\"");
  }
  return ref;
}

std::optional<ChannelKind> ReadChannel(ObjectReader& r, Diagnostics& diags) {
  auto text = r.String("channel", false);
  if (!text) return std::nullopt;
  auto kind = ParseChannelKind(*text);
  if (!kind) {
    std::vector<std::string> names = {"file", "memory", "durable", "mirrored", "stream", "shm", "nccl", "order"};
    std::string msg = "unknown channel kind \"" + *text + "\"; expected one of: " + Join(names, ", ");
    if (auto g = DidYouMean(*text, names); !g.empty())
      msg = "unknown channel kind \"" + *text + "\"; did you mean \"" + g + "\"?";
    diags.Error(r.PointerOf("channel"), msg);
  }
  return kind;
}

void ParseResources(const Json& j, const std::string& ptr, Resources& res, Diagnostics& diags) {
  ObjectReader r(j, ptr, diags, {"cpus", "gpus", "memory_mb", "gpu_memory_mb"});
  if (!r.IsObject("resources")) return;
  r.RejectUnknownKeys();
  if (auto v = r.Number("cpus", 0, 4096)) res.cpus = *v;
  if (auto v = r.Integer("gpus", 0, 1024)) res.gpus = static_cast<int>(*v);
  // 2^32 MB (4 PiB) a vertex: sums over the largest gangs stay far inside int64.
  if (auto v = r.Integer("memory_mb", 0, int64_t{1} << 32)) res.memory_mb = *v;
  if (auto v = r.Integer("gpu_memory_mb", 0, int64_t{1} << 32)) {
    res.gpu_memory_mb = *v;
    if (*v > 0 && res.gpus == 0)
      diags.Error(r.PointerOf("gpu_memory_mb"), "gpu_memory_mb needs gpus >= 1 (it bounds each GPU's memory)");
  }
}

void ParseDefaults(const Json& j, JobDefaults& d, Diagnostics& diags) {
  ObjectReader r(j, "/defaults", diags, {"channel", "max_attempts", "max_daemon_losses", "timeout_s"});
  if (!r.IsObject("defaults")) return;
  r.RejectUnknownKeys();
  if (auto c = ReadChannel(r, diags)) d.channel = *c;
  if (auto v = r.Integer("max_attempts", 1, 1000)) d.max_attempts = static_cast<int>(*v);
  if (auto v = r.Integer("max_daemon_losses", 1, 1000)) d.max_daemon_losses = static_cast<int>(*v);
  if (auto v = r.Number("timeout_s", 0, 1e9)) d.timeout_s = *v;
}

StageSpec ParseStage(const Json& j, std::string ptr, const JobDefaults& defaults, const ProgramCatalog& catalog,
                     Diagnostics& diags) {
  StageSpec s;
  s.pointer = ptr;
  s.max_attempts = defaults.max_attempts;
  s.max_daemon_losses = defaults.max_daemon_losses;
  s.timeout_s = defaults.timeout_s;
  ObjectReader r(j, ptr, diags,
                 {"name", "program", "replicas", "params", "resources", "max_attempts", "max_daemon_losses", "timeout_s",
                  "affinity", "input_hosts", "retain", "description"});
  if (!r.IsObject("a stage")) return s;
  r.RejectUnknownKeys();
  if (auto name = r.String("name", true)) {
    s.name = *name;
    if (!ValidName(s.name)) {
      diags.Error(r.PointerOf("name"),
                  "stage name \"" + s.name + "\" must start with a letter or '_' and hold only letters, digits, '_', '.', '-'");
    }
  }
  if (auto program = r.String("program", true)) {
    s.program = *program;
    if (catalog.check && !catalog.names.count(s.program)) {
      std::vector<std::string> names(catalog.names.begin(), catalog.names.end());
      std::string msg = "unknown program \"" + s.program + "\"";
      if (auto g = DidYouMean(s.program, names); !g.empty())
        msg += "; did you mean \"" + g + "\"?";
      else
        msg += " (see `copse programs` for the registered ones)";
      diags.Error(r.PointerOf("program"), msg);
    }
  }
  if (auto v = r.Integer("replicas", 1, kMaxReplicas)) s.replicas = static_cast<int>(*v);
  if (const Json* p = r.Find("params")) {
    if (p->is_object())
      s.params = *p;
    else
      diags.Error(r.PointerOf("params"), "expected an object, got " + JsonTypeName(*p));
  }
  if (catalog.check_params && catalog.names.count(s.program) && s.params.is_object()) {
    if (Status st = catalog.check_params(s.program, s.params); !st.ok()) {
      diags.Error(r.Find("params") ? r.PointerOf("params") : s.pointer, st.message() + " for program " + s.program);
    }
  }
  if (const Json* res = r.Find("resources")) ParseResources(*res, r.PointerOf("resources"), s.resources, diags);
  if (auto v = r.Integer("max_attempts", 1, 1000)) s.max_attempts = static_cast<int>(*v);
  if (auto v = r.Integer("max_daemon_losses", 1, 1000)) s.max_daemon_losses = static_cast<int>(*v);
  if (auto v = r.Number("timeout_s", 0, 1e9)) s.timeout_s = *v;
  if (auto a = r.String("affinity", false)) s.affinity = *a;
  if (const Json* keep = r.Find("retain")) {
    if (keep->is_boolean()) {
      s.retain_all = keep->get<bool>();
    } else if (keep->is_array()) {
      for (size_t i = 0; i < keep->size(); ++i) {
        const Json& x = (*keep)[i];
        if (x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() < 65536) {
          s.retain_ports.push_back(x.get<int>());
        } else {
          diags.Error(PointerAppend(r.PointerOf("retain"), i), "expected an output port (0 to 65535), got " + x.dump());
        }
      }
    } else {
      diags.Error(r.PointerOf("retain"), "expected true, false or an array of output ports, got " + JsonTypeName(*keep));
    }
  }
  if (const Json* h = r.Find("input_hosts")) {
    if (h->is_string()) {
      s.input_hosts.push_back(h->get<std::string>());
    } else if (h->is_array() && h->size() == static_cast<size_t>(s.replicas) &&
               std::all_of(h->begin(), h->end(), [](const Json& x) { return x.is_string(); })) {
      for (const auto& x : *h) s.input_hosts.push_back(x.get<std::string>());
    } else {
      diags.Error(r.PointerOf("input_hosts"), "expected a host name (\"{replica}\" allowed) or an array of " +
                                                  std::to_string(s.replicas) + " host names, one per replica");
    }
  }
  r.String("description", false);
  return s;
}

std::optional<int> ReadPort(ObjectReader& r, std::string_view key) {
  auto v = r.Integer(key, 0, 65535);
  if (!v) return std::nullopt;
  return static_cast<int>(*v);
}

EdgeSpec ParseEdge(const Json& j, std::string ptr, const JobDefaults& defaults, Diagnostics& diags) {
  EdgeSpec e;
  e.pointer = ptr;
  e.channel = defaults.channel;
  ObjectReader r(j, ptr, diags, {"from", "to", "pattern", "channel", "from_port", "to_port"});
  if (!r.IsObject("an edge")) return e;
  r.RejectUnknownKeys();
  if (auto f = ReadEndpoint(r, "from", true, diags)) e.from = *f;
  if (auto t = ReadEndpoint(r, "to", true, diags)) e.to = *t;
  if (auto p = r.String("pattern", false)) {
    e.pattern = ParseEdgePattern(*p);
    if (!e.pattern) {
      std::vector<std::string> names = {"pointwise", "all_to_all", "broadcast", "gather"};
      std::string msg = "unknown pattern \"" + *p + "\"";
      if (auto g = DidYouMean(*p, names); !g.empty())
        msg += "; did you mean \"" + g + "\"?";
      else
        msg += "; expected one of: " + Join(names, ", ");
      diags.Error(r.PointerOf("pattern"), msg);
    }
  }
  if (auto c = ReadChannel(r, diags)) e.channel = *c;
  e.from_port = ReadPort(r, "from_port");
  e.to_port = ReadPort(r, "to_port");
  if (e.channel == ChannelKind::kOrder && (e.from_port || e.to_port)) {
    diags.Error(ptr, "an \"order\" edge carries no data and cannot name ports");
  }
  return e;
}

OutputSpec ParseOutput(const Json& j, std::string ptr, Diagnostics& diags) {
  OutputSpec o;
  o.pointer = ptr;
  ObjectReader r(j, ptr, diags, {"from", "port", "path"});
  if (!r.IsObject("an output")) return o;
  r.RejectUnknownKeys();
  if (auto f = ReadEndpoint(r, "from", true, diags)) o.from = *f;
  if (auto p = ReadPort(r, "port")) o.port = *p;
  if (auto path = r.String("path", true)) {
    o.path = *path;
    bool escapes = o.path.empty() || o.path.front() == '/' || o.path == ".." || o.path.rfind("../", 0) == 0 ||
                   o.path.find("/../") != std::string::npos ||
                   (o.path.size() >= 3 && o.path.compare(o.path.size() - 3, 3, "/..") == 0);
    if (escapes) {
      diags.Error(r.PointerOf("path"), "expected a relative path inside the output directory, got \"" + o.path + "\"");
    }
  }
  return o;
}

FaultSpec ParseFault(const Json& j, std::string ptr, Diagnostics& diags) {
  FaultSpec f;
  f.pointer = ptr;
  ObjectReader r(
      j, ptr, diags,
      {"kill_daemon_of", "kill_daemon", "fail", "attempts", "delay", "ms", "corrupt_output_of", "drop_output_of", "when"});
  if (!r.IsObject("a fault")) return f;
  r.RejectUnknownKeys();
  std::vector<FaultKind> kinds;
  for (auto k : {FaultKind::kKillDaemonOf, FaultKind::kKillDaemon, FaultKind::kFail, FaultKind::kDelay,
                 FaultKind::kCorruptOutputOf, FaultKind::kDropOutputOf}) {
    if (r.Has(FaultKindName(k))) kinds.push_back(k);
  }
  if (kinds.size() != 1) {
    diags.Error(ptr,
                "expected exactly one of kill_daemon_of, kill_daemon, fail, delay, corrupt_output_of, "
                "drop_output_of; found " +
                    std::to_string(kinds.size()));
    return f;
  }
  f.kind = kinds[0];
  if (f.kind == FaultKind::kKillDaemon) {
    if (auto d = r.String("kill_daemon", true)) {
      f.daemon = *d;
      if (std::string why = DaemonNameProblem(*d); !why.empty()) diags.Error(r.PointerOf("kill_daemon"), why);
    }
  } else {
    f.vertex = ReadEndpoint(r, FaultKindName(f.kind), true, diags);
  }
  if (const Json* a = r.Find("attempts")) {
    if (f.kind != FaultKind::kFail && f.kind != FaultKind::kDelay) {
      diags.Error(r.PointerOf("attempts"), "\"attempts\" belongs to a \"fail\" or \"delay\" fault only");
    } else if (!a->is_array() || a->empty()) {
      diags.Error(r.PointerOf("attempts"), "expected a non-empty array of attempt numbers (1 = first)");
    } else {
      for (size_t i = 0; i < a->size(); ++i) {
        if (auto n = r.IntegerValue((*a)[i], PointerAppend(r.PointerOf("attempts"), i), 1, 1000)) {
          f.attempts.push_back(static_cast<int>(*n));
        }
      }
    }
  } else if (f.kind == FaultKind::kFail || f.kind == FaultKind::kDelay) {
    f.attempts = {1};  // the first attempt: a re-run (or a straggler's duplicate) is not slowed
  }
  if (r.Has("ms") && f.kind != FaultKind::kDelay) {
    diags.Error(r.PointerOf("ms"), "\"ms\" belongs to a \"delay\" fault only");
  } else if (f.kind == FaultKind::kDelay) {
    if (auto ms = r.Integer("ms", 0, 86'400'000, true)) f.ms = *ms;
  }
  if (const Json* w = r.Find("when")) {
    ObjectReader wr(*w, r.PointerOf("when"), diags, {"completed", "after_ms"});
    if (wr.IsObject("a trigger")) {
      wr.RejectUnknownKeys();
      f.when.completed = wr.Integer("completed", 0, INT64_MAX / 2);
      f.when.after_ms = wr.Integer("after_ms", 0, INT64_MAX / 2);
      if (wr.Has("completed") && wr.Has("after_ms")) {
        diags.Error(r.PointerOf("when"), "expected one of \"completed\" or \"after_ms\", not both");
      }
    }
  }
  return f;
}

template <typename Fn>
void ForEachInArray(const ObjectReader& top, const Json& doc, std::string_view key, bool required, Diagnostics& diags, Fn&& fn) {
  auto it = doc.find(key);
  std::string ptr = PointerAppend("", key);
  if (it == doc.end()) {
    if (required) diags.Error("", "missing required key \"" + std::string(key) + "\" (an array)");
    return;
  }
  if (!it->is_array()) {
    diags.Error(ptr, "expected an array, got " + JsonTypeName(*it));
    return;
  }
  for (size_t i = 0; i < it->size(); ++i) fn((*it)[i], PointerAppend(ptr, i));
}

}  // namespace

JobSpec ParseJobSpec(const Json& doc, const ProgramCatalog& catalog, Diagnostics& diags) {
  JobSpec spec;
  spec.source = doc;
  ObjectReader top(doc, "", diags,
                   {"version", "name", "description", "defaults", "durable_dir", "stages", "edges", "outputs", "faults"});
  if (!top.IsObject("a job")) return spec;
  top.RejectUnknownKeys();
  if (auto v = top.Integer("version", 1, INT32_MAX, false)) {
    if (*v != 1) diags.Error("/version", "unsupported version " + std::to_string(*v) + "; this copse reads version 1");
  }
  if (auto n = top.String("name", false)) spec.name = *n;
  if (spec.name.empty()) spec.name = "job";
  top.String("description", false);
  if (auto d = top.String("durable_dir", false)) {
    if (d->empty())
      diags.Error("/durable_dir", "expected a directory (relative to the job file), got \"\"");
    else
      spec.durable_dir = *d;
  }
  if (const Json* d = top.Find("defaults")) ParseDefaults(*d, spec.defaults, diags);

  ForEachInArray(top, doc, "stages", true, diags, [&](const Json& j, std::string ptr) {
    spec.stages.push_back(ParseStage(j, std::move(ptr), spec.defaults, catalog, diags));
  });
  if (doc.contains("stages") && doc["stages"].is_array() && doc["stages"].empty()) {
    diags.Error("/stages", "expected at least one stage");
  }
  ForEachInArray(top, doc, "edges", false, diags, [&](const Json& j, std::string ptr) {
    spec.edges.push_back(ParseEdge(j, std::move(ptr), spec.defaults, diags));
  });
  ForEachInArray(top, doc, "outputs", false, diags,
                 [&](const Json& j, std::string ptr) { spec.outputs.push_back(ParseOutput(j, std::move(ptr), diags)); });
  ForEachInArray(top, doc, "faults", false, diags,
                 [&](const Json& j, std::string ptr) { spec.faults.push_back(ParseFault(j, std::move(ptr), diags)); });
  return spec;
}

}  // namespace copse::jm
