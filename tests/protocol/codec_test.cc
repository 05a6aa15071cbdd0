// The protocol's codec: every message of the job manager <-> daemon conversation and of the data
// plane goes through a frame and back unchanged, and every rule the schema states is checked on
// the way in, the error naming the message and the field.
#include "protocol/codec.h"

#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "common/wire.h"
#include "protocol/checks.h"
#include "protocol/keys.h"

namespace copse::protocol {
namespace {

/// Encodes `m` into a frame, checks the header, decodes the body.
template <class Envelope>
Result<Envelope> RoundTrip(const Envelope& m) {
  if constexpr (std::is_same_v<Envelope, JournalRecord>) {
    // Framed by the journal itself (jobmanager/journal.h); checked by the scheduler's replay.
    JournalRecord back;
    REQUIRE(back.ParseFromString(m.SerializeAsString()));
    COPSE_RETURN_NOT_OK(Check(back));
    return back;
  } else {
    const std::string frame = EncodeFrame(m);
    auto header = wire::DecodeHeader(frame.data(), wire::kMaxControlBytes);
    REQUIRE(header.ok());
    CHECK(header->type == wire::FrameType::kProto);
    REQUIRE(header->length == frame.size() - wire::kHeaderBytes);
    const std::string_view body(frame.data() + wire::kHeaderBytes, header->length);
    if constexpr (std::is_same_v<Envelope, DaemonToJm>) {
      return DecodeDaemonToJm(body);
    } else {
      return DecodeJmToDaemon(body);
    }
  }
}

Task ValidTask() {
  Task t;
  t.set_job(3);
  t.set_vertex(7);
  t.set_version(2);
  t.set_name("map[7]");
  t.set_program("noop");
  t.set_params_json(R"({"k":1})");
  t.set_threads(1);
  *t.add_inputs()->mutable_stored()->mutable_key() = MakeOutputKey(3, 1, 1, 0);
  t.mutable_inputs(0)->mutable_stored()->mutable_store()->set_local(true);
  t.add_inputs()->mutable_empty();
  LiveInput& live = *t.add_inputs()->mutable_live();
  live.set_kind(CHANNEL_STREAM);
  *live.mutable_key() = MakeStreamKey(3, 4, 2);
  t.add_outputs()->set_stored(CHANNEL_MEMORY);
  t.add_outputs()->set_durable("/shared/copy");
  LiveOutput& out = *t.add_outputs()->mutable_live();
  out.set_kind(CHANNEL_STREAM);
  LiveChannel& ch = *out.add_channels();
  *ch.mutable_key() = MakeStreamKey(3, 5, 2);
  ch.mutable_peer()->set_tcp("tcp://127.0.0.1:5000");
  ChainedAfter& after = *t.add_after();
  after.set_vertex(6);
  after.set_version(1);
  return t;
}

/// One kind of message: a valid one, and (when it has rules) the same with one rule broken.
template <class Envelope>
struct MessageCase {
  const char* name;
  std::function<void(Envelope&)> valid;
  std::function<void(Envelope&)> break_it;  // one rule broken
  const char* field;                        // the path the error names
};
using Case = MessageCase<DaemonToJm>;
using JmCase = MessageCase<JmToDaemon>;

/// Each case round-trips, its broken form is refused naming the field, and the cases cover
/// every kind of body the schema has.
template <class Envelope>
void CheckEveryKind(const std::vector<MessageCase<Envelope>>& cases) {
  size_t kinds = 0;
  for (const MessageCase<Envelope>& c : cases) {
    CAPTURE(c.name);
    Envelope m;
    c.valid(m);
    CHECK(BodyName(m) == c.name);
    auto back = RoundTrip(m);
    REQUIRE_MESSAGE(back.ok(), back.status().ToString());
    CHECK(back->SerializeAsString() == m.SerializeAsString());
    ++kinds;
    if (!c.break_it) continue;  // nothing in it to break
    c.break_it(m);
    auto bad = RoundTrip(m);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(bad.status().message().find(c.field) != std::string::npos, bad.status().message());
  }
  CHECK(kinds == static_cast<size_t>(Envelope::descriptor()->FindOneofByName("body")->field_count()));
}

const std::vector<Case>& DaemonCases() {
  static const std::vector<Case> cases = {
      {"register",
       [](DaemonToJm& m) {
         Register& r = *m.mutable_register_();
         r.set_name("d0");
         r.set_cpus(2);
         r.set_data_host("127.0.0.1");
         r.set_data_port(9000);
         (*r.mutable_labels())["host"] = "h1";
         r.mutable_stream()->set_tcp("tcp://127.0.0.1:5000");
         *r.add_outputs() = MakeOutputKey(1, 2, 3, 4);
       },
       [](DaemonToJm& m) { m.mutable_register_()->set_data_port(70000); }, "DaemonToJm.register.data_port: must be 1 to 65535"},
      {"heartbeat", [](DaemonToJm& m) { m.mutable_heartbeat(); }, nullptr, nullptr},
      {"report",
       [](DaemonToJm& m) {
         AttemptReport& a = *m.mutable_report()->add_attempts();
         a.set_job(1);
         a.set_vertex(2);
         a.set_version(1);
         a.set_ok(true);
         a.add_output_bytes(10);
         a.add_output_messages(1);
         a.set_progress_json(R"({"loss":0.5})");
         AttemptReport& f = *m.mutable_report()->add_attempts();
         f.set_version(1);
         f.set_failure(FAILURE_INPUT_LOST);
         f.set_lost_input(0);
       },
       [](DaemonToJm& m) { m.mutable_report()->mutable_attempts(1)->set_failure(FAILURE_TIMEOUT); },
       "DaemonToJm.report.attempts[1].failure: a failed attempt needs"},
      {"vertex_log",
       [](DaemonToJm& m) {
         VertexLog& l = *m.mutable_vertex_log();
         l.set_version(1);
         LogChunk& c = *l.add_chunks();
         c.set_stream("stderr");
         c.set_text("\xff not UTF-8");
       },
       [](DaemonToJm& m) { m.mutable_vertex_log()->set_version(0); }, "DaemonToJm.vertex_log.version: required"},
      {"nccl_id",
       [](DaemonToJm& m) {
         m.mutable_nccl_id()->set_group("job1-gang0-v1");
         m.mutable_nccl_id()->set_id(std::string(128, '\0'));
       },
       [](DaemonToJm& m) { m.mutable_nccl_id()->clear_group(); }, "DaemonToJm.nccl_id.group: required"},
      {"mirrored",
       [](DaemonToJm& m) {
         *m.mutable_mirrored()->mutable_key() = MakeOutputKey(1, 4, 2, 0);
         m.mutable_mirrored()->set_ok(true);
         m.mutable_mirrored()->set_bytes(4096);
       },
       [](DaemonToJm& m) { m.mutable_mirrored()->set_ok(false); }, "DaemonToJm.mirrored.error: required when not ok"},
  };
  return cases;
}

const std::vector<JmCase>& JmCases() {
  static const std::vector<JmCase> cases = {
      {"registered",
       [](JmToDaemon& m) {
         m.mutable_registered()->set_daemon(4);
         m.mutable_registered()->set_heartbeat_ms(200);
       },
       [](JmToDaemon& m) { m.mutable_registered()->set_heartbeat_ms(0); }, "JmToDaemon.registered.heartbeat_ms: must be 1 to"},
      {"run", [](JmToDaemon& m) { *m.mutable_run()->add_tasks() = ValidTask(); },
       [](JmToDaemon& m) { m.mutable_run()->mutable_tasks(0)->mutable_inputs(0)->mutable_stored()->clear_key(); },
       "JmToDaemon.run.tasks[0].inputs[0].stored.key: required"},
      {"cancel",
       [](JmToDaemon& m) {
         m.mutable_cancel()->set_job(1);
         m.mutable_cancel()->set_vertex(0);
       },
       nullptr, nullptr},
      {"gc",
       [](JmToDaemon& m) {
         m.mutable_gc()->set_job(1);
         *m.mutable_gc()->add_keep() = MakeOutputKey(1, 0, 1, 0);
       },
       nullptr, nullptr},
      {"release", [](JmToDaemon& m) { *m.mutable_release()->add_keys() = MakeOutputKey(1, 0, 1, 0); }, nullptr, nullptr},
      {"peer_lost",
       [](JmToDaemon& m) {
         m.mutable_peer_lost()->set_host("10.0.0.1");
         m.mutable_peer_lost()->set_port(9000);
       },
       [](JmToDaemon& m) { m.mutable_peer_lost()->set_port(0); }, "JmToDaemon.peer_lost.port: must be 1 to 65535, got 0"},
      {"nccl_id",
       [](JmToDaemon& m) {
         m.mutable_nccl_id()->set_group("g");
         m.mutable_nccl_id()->set_id("x");
       },
       [](JmToDaemon& m) { m.mutable_nccl_id()->clear_id(); }, "JmToDaemon.nccl_id.id: required"},
      {"cut", [](JmToDaemon& m) { m.mutable_cut()->set_ms(500); }, [](JmToDaemon& m) { m.mutable_cut()->set_ms(-1); },
       "JmToDaemon.cut.ms: must be 0 to 86400000, got -1"},
      {"kill", [](JmToDaemon& m) { m.mutable_kill(); }, nullptr, nullptr},
      {"damage",
       [](JmToDaemon& m) {
         m.mutable_damage()->set_damage(DamageOutputs::CORRUPT);
         *m.mutable_damage()->add_keys() = MakeOutputKey(1, 0, 1, 0);
       },
       [](JmToDaemon& m) { m.mutable_damage()->set_damage(DamageOutputs::DAMAGE_UNSPECIFIED); },
       "JmToDaemon.damage.damage: must be CORRUPT or DROP"},
      {"mirror",
       [](JmToDaemon& m) {
         *m.mutable_mirror()->mutable_key() = MakeOutputKey(1, 4, 2, 0);
         m.mutable_mirror()->mutable_from()->set_host("10.0.0.2");
         m.mutable_mirror()->mutable_from()->set_port(7000);
       },
       [](JmToDaemon& m) { m.mutable_mirror()->mutable_from()->set_port(0); },
       "JmToDaemon.mirror.from.port: must be 1 to 65535, got 0"},
  };
  return cases;
}

const std::vector<MessageCase<JournalRecord>>& JournalCases() {
  using J = JournalRecord;
  static const std::vector<MessageCase<J>> cases = {
      {"job",
       [](J& r) {
         r.mutable_job()->set_job(3);
         r.mutable_job()->set_doc_json(R"({"stages": []})");
         r.mutable_job()->set_job_dir("/data/\xff");  // a path: any bytes
         r.mutable_job()->set_submitted_unix_ms(1700000000000);
       },
       [](J& r) { r.mutable_job()->clear_doc_json(); }, "JournalRecord.job.doc_json: required"},
      {"done",
       [](J& r) {
         VertexDone& d = *r.mutable_done();
         d.set_job(3);
         d.set_vertex(7);
         d.set_version(1000001);
         d.set_daemon("d0");
         d.add_output_bytes(10);
         d.add_output_messages(1);
       },
       [](J& r) { r.mutable_done()->set_version(0); }, "JournalRecord.done.version: required (>= 1)"},
      {"regen",
       [](J& r) {
         r.mutable_regen()->set_job(3);
         r.mutable_regen()->set_vertex(7);
       },
       [](J& r) { r.mutable_regen()->set_job(0); }, "JournalRecord.regen.job: must be 1 to 9007199254740991, got 0"},
      {"end",
       [](J& r) {
         JobEnded& e = *r.mutable_end();
         e.set_job(3);
         e.set_state(JOB_FAILED);
         e.set_failure("program said \xff");
         e.set_elapsed_ms(1500);
         e.add_faults()->set_fault("fail");
         e.add_recoveries()->set_reason("program_error");
         e.add_faults_fired("/faults/0");
         e.mutable_failed_attempt()->set_vertex("a[0]");
       },
       [](J& r) { r.mutable_end()->set_state(JOB_END_STATE_UNSPECIFIED); },
       "JournalRecord.end.state: must be COMPLETED, FAILED or CANCELLED, got 0"},
      {"ids", [](J& r) { r.mutable_ids()->set_up_to(9); }, [](J& r) { r.mutable_ids()->set_up_to(uint64_t{1} << 53); },
       "JournalRecord.ids.up_to: must be 1 to 9007199254740991"},
      {"restart", [](J& r) { r.mutable_restart()->set_restarts(2); }, nullptr, nullptr},
  };
  return cases;
}

TEST_CASE("Codec.EveryDaemonMessageRoundTripsAndItsRulesNameTheField") { CheckEveryKind(DaemonCases()); }

TEST_CASE("Codec.EveryJournalRecordRoundTripsAndItsRulesNameTheField") {
  CheckEveryKind(JournalCases());
  CHECK(Check(JournalRecord()).message() == "JournalRecord.body: empty");
}

TEST_CASE("Codec.EveryJobManagerMessageRoundTripsAndItsRulesNameTheField") { CheckEveryKind(JmCases()); }

TEST_CASE("Codec.EveryDataPlaneMessageRoundTripsAndItsRulesNameTheField") {
  // Each data-plane message through a frame and back, then broken: the error names the field.
  auto decode_frame = [](const google::protobuf::Message& m, auto decode) {
    const std::string frame = EncodeFrame(m);
    auto header = wire::DecodeHeader(frame.data(), wire::kMaxControlBytes);
    REQUIRE(header.ok());
    CHECK(header->type == wire::FrameType::kProto);
    return decode(std::string_view(frame.data() + wire::kHeaderBytes, header->length));
  };
  DataRequest fetch;
  *fetch.mutable_fetch()->mutable_key() = MakeOutputKey(3, 7, 2, 1);
  fetch.mutable_fetch()->set_wait_ms(250);
  auto fetched = decode_frame(fetch, DecodeDataRequest);
  REQUIRE_MESSAGE(fetched.ok(), fetched.status().ToString());
  CHECK(fetched->fetch().key().vertex() == 7);
  CHECK(fetched->fetch().wait_ms() == 250);
  CHECK(BodyName(*fetched) == "fetch");
  fetch.mutable_fetch()->clear_key();
  CHECK(decode_frame(fetch, DecodeDataRequest).status().message() == "DataRequest.fetch.key: required");
  DataRequest ping;
  ping.mutable_ping();
  CHECK(decode_frame(ping, DecodeDataRequest).ok());
  CHECK(decode_frame(DataRequest(), DecodeDataRequest).status().message() == "DataRequest.body: empty");

  DataReply pong;
  pong.mutable_pong();
  CHECK(decode_frame(pong, DecodeDataReply)->has_pong());
  CHECK(decode_frame(DataReply(), DecodeDataReply).status().message() == "DataReply.body: empty");

  FetchEnd end;
  end.set_ok(true);
  end.set_messages(4);
  end.set_bytes(100);
  end.set_handoff(true);
  auto ended = decode_frame(end, DecodeFetchEnd);
  REQUIRE(ended.ok());
  CHECK(ended->messages() == 4);
  CHECK(ended->handoff());
  end.set_code("NotFound");
  CHECK(decode_frame(end, DecodeFetchEnd).status().message() == "FetchEnd.code: must be empty when ok");
  end.set_ok(false);
  CHECK(decode_frame(end, DecodeFetchEnd).status().message() == "FetchEnd.handoff: only when ok");
  end.set_handoff(false);
  end.set_message("no such output");
  CHECK(decode_frame(end, DecodeFetchEnd).ok());
  end.clear_code();
  CHECK(decode_frame(end, DecodeFetchEnd).status().message() == "FetchEnd.code: required when not ok");
}

TEST_CASE("Codec.ATasksEveryRuleIsChecked") {
  struct Broken {
    std::function<void(Task&)> change;
    const char* field;
  };
  const std::vector<Broken> broken = {
      {[](Task& t) { t.set_version(0); }, "tasks[0].version: required"},
      {[](Task& t) { t.clear_name(); }, "tasks[0].name: required"},
      {[](Task& t) { t.clear_program(); }, "tasks[0].program: required"},
      {[](Task& t) { t.set_threads(0); }, "tasks[0].threads: required"},
      {[](Task& t) { t.set_delay_ms(86'400'001); }, "tasks[0].delay_ms: must be 0 to 86400000"},
      {[](Task& t) { t.add_inputs(); }, "tasks[0].inputs[3].source: required"},
      {[](Task& t) { t.mutable_inputs(0)->mutable_stored()->clear_store(); }, "tasks[0].inputs[0].stored.store: required"},
      {[](Task& t) { t.mutable_inputs(0)->mutable_stored()->mutable_store()->set_local(false); },
       "tasks[0].inputs[0].stored.store.host: required when not local"},
      {[](Task& t) { t.mutable_inputs(2)->mutable_live()->set_kind(CHANNEL_FILE); },
       "tasks[0].inputs[2].live.kind: must be stream, shm or nccl"},
      {[](Task& t) { t.mutable_outputs(0)->set_stored(CHANNEL_STREAM); }, "tasks[0].outputs[0].stored: must be file or memory"},
      {[](Task& t) { t.mutable_outputs(1)->set_durable(""); }, "tasks[0].outputs[1].durable: a path is required"},
      {[](Task& t) { t.mutable_outputs(2)->mutable_live()->clear_channels(); },
       "tasks[0].outputs[2].live.channels: at least one"},
      {[](Task& t) { t.mutable_outputs(2)->mutable_live()->mutable_channels(0)->clear_peer(); },
       "tasks[0].outputs[2].live.channels[0].peer.tcp: required for stream"},
      {[](Task& t) { t.add_outputs(); }, "tasks[0].outputs[3].sink: required"},
      {[](Task& t) {
         t.mutable_nccl()->set_group("g");
         t.mutable_nccl()->set_nranks(2);
         t.mutable_nccl()->set_rank(2);
       },
       "tasks[0].nccl.rank: must be 0 to 1, got 2"},
      {[](Task& t) { t.mutable_after(0)->set_version(0); }, "tasks[0].after[0].version: required"},
      {[](Task& t) {
         t.mutable_after(0)->set_remote(true);
         *t.add_after() = t.after(0);
       },
       "tasks[0].after: at most one attempt on another daemon"},
  };
  for (const Broken& b : broken) {
    CAPTURE(b.field);
    JmToDaemon m;
    Task& t = *m.mutable_run()->add_tasks();
    t = ValidTask();
    REQUIRE(Check(m).ok());
    b.change(t);
    const Status st = Check(m);
    CHECK_MESSAGE(st.message().find(std::string("JmToDaemon.run.") + b.field) != std::string::npos, st.message());
  }
}

TEST_CASE("Codec.BodiesThatAreNotMessagesAreRefused") {
  for (std::string_view body : {std::string_view("\xff\xff\xff"), std::string_view("\x0a\x05", 2)}) {
    auto decoded = DecodeJmToDaemon(body);
    REQUIRE_FALSE(decoded.ok());
    CHECK_MESSAGE(decoded.status().message().find("JmToDaemon: the body does not parse") != std::string::npos,
                  decoded.status().message());
  }
  auto empty = DecodeDaemonToJm("");
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().message().find("DaemonToJm.body: empty") != std::string::npos);
  // A kind of message a newer peer has (field 99, a varint): let through with no body, to be
  // ignored, not a reason to hang up on that peer.
  auto newer = DecodeJmToDaemon(std::string("\xf8\x06\x01", 3));
  REQUIRE_MESSAGE(newer.ok(), newer.status().ToString());
  CHECK(newer->body_case() == JmToDaemon::BODY_NOT_SET);
  CHECK(BodyName(*newer) == "nothing");
}

TEST_CASE("Codec.PeersOfAnotherProtocolVersionAreToldWhichVersionsMet") {
  std::string frame = EncodeFrame(JmToDaemon());
  frame[4] = 1;  // version 1, little-endian
  frame[5] = 0;
  auto header = wire::DecodeHeader(frame.data(), wire::kMaxControlBytes);
  REQUIRE_FALSE(header.ok());
  CHECK_MESSAGE(header.status().message().find("the peer speaks copse protocol version 1, this copse " +
                                               std::to_string(wire::kProtocolVersion)) != std::string::npos,
                header.status().message());
}

TEST_CASE("Codec.MessagesPrintAsTheSchemasJson") {
  JmToDaemon m;
  *m.mutable_run()->add_tasks() = ValidTask();
  const std::string json = ToJsonText(m);
  CHECK_MESSAGE(json.find(R"("params_json":"{\"k\":1}")") != std::string::npos, json);
  CHECK_MESSAGE(json.find(R"("kind":"CHANNEL_STREAM")") != std::string::npos, json);
  CHECK(ToString(MakeOutputKey(3, 12, 2, 0)) == "job3/v12.v2/p0");
  CHECK(ToString(MakeStreamKey(3, 7, 2)) == "job3/c7.v2");
  CHECK(ParseFailureClass("input_lost") == FAILURE_INPUT_LOST);
  CHECK(FailureClassName(FAILURE_CANCELLED) == "cancelled");
  CHECK(ChannelKindName(CHANNEL_SHM) == "shm");
}

}  // namespace
}  // namespace copse::protocol
