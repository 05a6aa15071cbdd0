// The daemon's output store: complete-or-nothing outputs, exact message boundaries, zero-copy
// memory reads, checksums, spilling and garbage collection.
#include "channels/output_store.h"

#include <doctest/doctest.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "channels/record_format.h"
#include "tests/channels/channel_test_util.h"

namespace copse::chan {
namespace {

using testing::Drain;
using testing::DrainStatus;
using testing::Pattern;
using testing::PayloadMessage;
using testing::TempDir;
using testing::WriteMemoryOutput;

std::unique_ptr<OutputStore> MakeStore(const TempDir& dir, uint64_t budget = 1ull << 30) {
  auto s = OutputStore::Make(dir.path() / "outputs", budget);
  REQUIRE_MESSAGE(s.ok(), s.status().ToString());
  return std::move(s).value();
}

std::vector<std::string> Messages() {
  // Empty messages, tiny ones, one spanning the file buffer, one larger than it.
  std::vector<std::string> m = {"", "a", "", "hello world", Pattern(1000, 1, 0)};
  m.push_back(Pattern((1 << 20) - 5, 2, 0));
  m.push_back(Pattern(3 << 20, 3, 0));
  for (int i = 0; i < 300; ++i) m.push_back(Pattern(static_cast<size_t>(i * 7), 4, i));
  m.push_back("");
  return m;
}

void WriteAll(OutputStore& store, const OutputKey& key, StorageKind kind, const std::vector<std::string>& msgs) {
  auto w = store.CreateWriter(key, kind);
  REQUIRE_MESSAGE(w.ok(), w.status().ToString());
  for (const auto& m : msgs) REQUIRE((*w)->Write(Buffer(m)).ok());
  Status st = (*w)->Close();
  REQUIRE_MESSAGE(st.ok(), st.ToString());
}

std::vector<std::string> ReadAll(OutputStore& store, const OutputKey& key) {
  auto r = store.OpenReader(key);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  return Drain(**r);
}

/// Regular files under `dir` whose names end with `suffix`, but for the store's boot_id.
size_t CountFiles(const std::filesystem::path& dir, const std::string& suffix = "") {
  size_t n = 0;
  if (!std::filesystem::exists(dir)) return 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    n += e.is_regular_file() && name != "boot_id" && name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  }
  return n;
}

}  // namespace

TEST_CASE("OutputKey.ToStringAndJson" * doctest::timeout(5)) {
  OutputKey k{3, 12, 2, 0};
  CHECK(k.ToString() == "job3/v12.v2/p0");
  auto back = OutputKey::FromJson(k.ToJson());
  REQUIRE(back.ok());
  CHECK(*back == k);
  auto bad = OutputKey::FromJson(Json{{"job", 1}, {"vertex", -1}, {"version", 0}, {"port", 0}});
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("/vertex") != std::string::npos);
  CHECK(!OutputKey::FromJson(Json{{"job", 1}}).ok());
  CHECK(!OutputKey::FromJson(Json::array()).ok());
}

TEST_CASE("OutputStore.RoundTripKeepsMessageBoundaries" * doctest::timeout(20)) {
  TempDir dir;
  auto store = MakeStore(dir);
  auto msgs = Messages();
  for (auto kind : {StorageKind::kFile, StorageKind::kMemory}) {
    OutputKey key{1, 2, 0, kind == StorageKind::kFile ? 0u : 1u};
    WriteAll(*store, key, kind, msgs);
    CHECK(store->Contains(key));
    CHECK(ReadAll(*store, key) == msgs);
    CHECK(ReadAll(*store, key) == msgs);  // readable again
    uint64_t bytes = 0;
    for (const auto& m : msgs) bytes += m.size();
    CHECK(*store->Size(key) == bytes);
    CHECK(store->Info(key)->messages == msgs.size());
  }
}

TEST_CASE("OutputStore.SmallFilesReadWholeThroughABufferOfTheirSize" * doctest::timeout(10)) {
  // A reader's buffer follows the file's size (4 KiB at least): messages over a quarter of it
  // take the large-message path even in a file of a few KiB, and files just over the minimum
  // hold messages that straddle the buffer's end.
  TempDir dir;
  auto store = MakeStore(dir);
  const std::vector<std::vector<std::string>> files = {
      {"x"},
      {Pattern(1500, 1, 0)},
      {Pattern(3000, 2, 0), "y", Pattern(2000, 3, 0)},
      {Pattern(4090, 4, 0)},
      {Pattern(900, 5, 0), Pattern(900, 6, 0), Pattern(900, 7, 0), Pattern(900, 8, 0), Pattern(900, 9, 0)},
      {Pattern(70000, 10, 0), Pattern(10, 11, 0)},
  };
  for (uint32_t i = 0; i < files.size(); ++i) {
    const OutputKey key{1, 7, i, 0};
    WriteAll(*store, key, StorageKind::kFile, files[i]);
    CHECK(ReadAll(*store, key) == files[i]);
  }
}

TEST_CASE("OutputStore.OutputsAreReadableByTheirOwnerAlone" * doctest::timeout(10)) {
  namespace fs = std::filesystem;
  TempDir dir;
  fs::create_directories(dir.path() / "outputs");
  fs::permissions(dir.path() / "outputs", fs::perms::all);  // as an earlier version left it
  auto store = MakeStore(dir);
  WriteAll(*store, {1, 2, 1, 0}, StorageKind::kFile, Messages());
  CHECK((fs::status(dir.path() / "outputs").permissions() & fs::perms::all) == fs::perms::owner_all);
  size_t files = 0;
  for (const auto& f : fs::recursive_directory_iterator(dir.path() / "outputs")) {
    if (!f.is_regular_file() || f.path().extension() != ".out") continue;
    ++files;
    CHECK((f.status().permissions() & (fs::perms::group_all | fs::perms::others_all)) == fs::perms::none);
  }
  CHECK(files == 1);
}

TEST_CASE("OutputStore.EmptyOutputsNeedNoFile" * doctest::timeout(5)) {
  TempDir dir;
  auto store = MakeStore(dir);
  for (uint32_t v = 0; v < 100; ++v) WriteAll(*store, {7, v, 0, 0}, StorageKind::kFile, {});
  WriteAll(*store, {7, 100, 0, 0}, StorageKind::kMemory, {});
  CHECK(CountFiles(dir.path() / "outputs") == 0);
  CHECK(ReadAll(*store, {7, 5, 0, 0}).empty());
  CHECK(ReadAll(*store, {7, 100, 0, 0}).empty());
  CHECK(*store->Size({7, 5, 0, 0}) == 0);
  CHECK(store->List(7).size() == 101);
}

TEST_CASE("OutputStore.WaitForReturnsWhenItsOwnKeyArrives" * doctest::timeout(20)) {
  TempDir dir;
  auto store = MakeStore(dir);
  const OutputKey a{7, 1, 1, 0}, b{7, 2, 1, 0}, c{7, 3, 1, 0};
  std::atomic<int> a_seen{-1}, b_seen{-1};
  std::thread wait_a([&] { a_seen = store->WaitFor(a, std::chrono::seconds(10)); });
  std::thread wait_b([&] { b_seen = store->WaitFor(b, std::chrono::seconds(10)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  WriteMemoryOutput(*store, c, {Buffer("c")});  // another key: nobody returns
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(a_seen == -1);
  CHECK(b_seen == -1);
  WriteMemoryOutput(*store, a, {Buffer("a")});
  wait_a.join();
  CHECK(a_seen == 1);
  CHECK(b_seen == -1);
  WriteMemoryOutput(*store, b, {Buffer("b")});
  wait_b.join();
  CHECK(b_seen == 1);
  REQUIRE(store->Remove(b).ok());  // removed by a fault: it will not come, so nobody waits
  CHECK(store->WaitFor(b, std::chrono::seconds(10)));
  CHECK(!store->WaitFor(OutputKey{7, 4, 1, 0}, std::chrono::milliseconds(20)));  // never comes
}

TEST_CASE("OutputStore.MemoryReadsShareBuffers" * doctest::timeout(5)) {
  TempDir dir;
  auto store = MakeStore(dir);
  Buffer a(std::string(1000, 'x')), b(std::string("second"));
  OutputKey key{1, 1, 1, 0};
  auto w = store->CreateWriter(key, StorageKind::kMemory);
  REQUIRE(w.ok());
  REQUIRE((*w)->Write(a).ok());
  REQUIRE((*w)->Write(b).ok());
  REQUIRE((*w)->Close().ok());
  CHECK(store->memory_bytes() == 1006);
  auto r = store->OpenReader(key);
  REQUIRE(r.ok());
  auto m1 = (*r)->Next();
  auto m2 = (*r)->Next();
  REQUIRE((m1.ok() && m2.ok() && m1->has_value() && m2->has_value()));
  CHECK((*m1)->data() == a.data());  // the very same storage: no copy
  CHECK((*m2)->data() == b.data());
  CHECK(!(*r)->Next()->has_value());
  store->Drop(key);
  CHECK(store->memory_bytes() == 0);
}

TEST_CASE("OutputStore.PayloadsStayObjectsUntilBytesAreNeeded" * doctest::timeout(10)) {
  TempDir dir;
  auto store = MakeStore(dir, 1 << 20);
  auto object = std::make_shared<testing::CountingPayload>(Pattern(1000, 7, 0));
  OutputKey key{1, 2, 1, 0};
  WriteMemoryOutput(*store, key, {PayloadMessage(object)});
  CHECK(store->Info(key)->bytes == 1000);  // the encoded size, known without encoding
  auto r = store->OpenReader(key);
  REQUIRE(r.ok());
  auto m = (*r)->Next();
  REQUIRE((m.ok() && m->has_value()));
  CHECK((*m)->payload() == object.get());  // the object itself: no encoding, copy or hash
  CHECK(object->encodes == 0);
  CHECK((*m)->view() == Pattern(1000, 7, 0));  // bytes on demand, once
  CHECK((*m)->view() == Pattern(1000, 7, 0));
  CHECK(object->encodes == 1);
  // Damaging a payload output damages its bytes: the next read is DataLoss.
  REQUIRE(store->Corrupt(key).ok());
  auto bad = store->OpenReader(key);
  CHECK((bad.ok() ? DrainStatus(**bad) : bad.status()).code() == StatusCode::kDataLoss);
  // An output over the budget spills: its payloads are encoded to the file and read back as bytes.
  auto big = std::make_shared<testing::CountingPayload>(Pattern(2 << 20, 8, 0));
  OutputKey spilled{1, 3, 1, 0};
  WriteMemoryOutput(*store, spilled, {PayloadMessage(big)});
  CHECK(!store->Info(spilled)->in_memory);
  CHECK(ReadAll(*store, spilled) == std::vector<std::string>{Pattern(2 << 20, 8, 0)});
}

TEST_CASE("OutputStore.PayloadSpansAreWrittenToFilesInPlace" * doctest::timeout(10)) {
  TempDir dir;
  auto store = MakeStore(dir, 1 << 20);
  // Spilled (over the memory budget), and a memory output with a durable copy: both write the
  // spans as they are, with the checksum of their concatenation, and never encode.
  auto big = std::make_shared<testing::SpannedPayload>(std::vector<std::string>{"head", Pattern(2 << 20, 4, 0), "", "tail"});
  OutputKey spilled{1, 4, 1, 0};
  WriteMemoryOutput(*store, spilled, {PayloadMessage(big)});
  CHECK(!store->Info(spilled)->in_memory);
  CHECK(ReadAll(*store, spilled) == std::vector<std::string>{big->Joined()});

  auto small = std::make_shared<testing::SpannedPayload>(std::vector<std::string>{"a", Pattern(3000, 2, 0), "z"});
  OutputKey durable{1, 5, 1, 0};
  WriteMemoryOutput(*store, durable, {PayloadMessage(small)}, dir.path() / "copy.out");
  auto copy = OutputStore::OpenDurableCopy(dir.path() / "copy.out", durable);  // checksums verified
  REQUIRE(copy.ok());
  auto rec = (*copy)->Next();
  REQUIRE((rec.ok() && rec->has_value()));
  CHECK((*rec)->view() == small->Joined());
  CHECK(big->encodes == 0);
  CHECK(small->encodes == 0);
}

TEST_CASE("OutputStore.IncompleteWritersAreInvisible" * doctest::timeout(5)) {
  TempDir dir;
  auto store = MakeStore(dir);
  for (auto kind : {StorageKind::kFile, StorageKind::kMemory}) {
    OutputKey key{2, 1, 0, kind == StorageKind::kFile ? 0u : 1u};
    {
      auto w = store->CreateWriter(key, kind);
      REQUIRE(w.ok());
      REQUIRE((*w)->Write(Buffer(std::string(5000, 'q'))).ok());
      CHECK(!store->Contains(key));
      CHECK(store->OpenReader(key).status().code() == StatusCode::kNotFound);
      CHECK(store->Size(key).status().code() == StatusCode::kNotFound);
    }  // destroyed without Close: discarded
    CHECK(!store->Contains(key));
    CHECK(store->OpenReader(key).status().code() == StatusCode::kNotFound);
  }
  CHECK(CountFiles(dir.path() / "outputs") == 0);  // the temp file is gone too
  CHECK(store->memory_bytes() == 0);
}

TEST_CASE("OutputStore.DuplicateKeyIsRefused" * doctest::timeout(5)) {
  TempDir dir;
  auto store = MakeStore(dir);
  OutputKey key{2, 2, 0, 0};
  auto early = store->CreateWriter(key, StorageKind::kFile);
  REQUIRE(early.ok());
  WriteAll(*store, key, StorageKind::kFile, {"one"});
  CHECK(store->CreateWriter(key, StorageKind::kMemory).status().code() == StatusCode::kAlreadyExists);
  REQUIRE((*early)->Write(Buffer(std::string("two"))).ok());
  CHECK((*early)->Close().code() == StatusCode::kAlreadyExists);  // the first to close wins
  CHECK(ReadAll(*store, key) == std::vector<std::string>{"one"});
  CHECK(CountFiles(dir.path() / "outputs") == 1);
}

TEST_CASE("OutputStore.CorruptionIsDataLoss" * doctest::timeout(10)) {
  TempDir dir;
  auto store = MakeStore(dir);
  auto msgs = Messages();
  for (auto kind : {StorageKind::kFile, StorageKind::kMemory}) {
    OutputKey key{3, 1, 0, kind == StorageKind::kFile ? 0u : 1u};
    WriteAll(*store, key, kind, msgs);
    REQUIRE(store->Corrupt(key).ok());
    auto r = store->OpenReader(key);
    Status st = r.ok() ? DrainStatus(**r) : r.status();
    CHECK(st.code() == StatusCode::kDataLoss);
    CHECK(st.message().find(key.ToString()) != std::string::npos);
  }
  // An output without bytes is marked damaged.
  OutputKey empty{3, 2, 0, 0};
  WriteAll(*store, empty, StorageKind::kMemory, {});
  REQUIRE(store->Corrupt(empty).ok());
  CHECK(store->OpenReader(empty).status().code() == StatusCode::kDataLoss);
  CHECK(store->Corrupt({9, 9, 9, 9}).code() == StatusCode::kNotFound);
}

TEST_CASE("OutputStore.RemovedOutputIsLost" * doctest::timeout(5)) {
  TempDir dir;
  auto store = MakeStore(dir);
  OutputKey key{4, 1, 0, 0};
  WriteAll(*store, key, StorageKind::kFile, {"x", "y"});
  auto open = store->OpenReader(key);  // a reader opened before the removal keeps working
  REQUIRE(open.ok());
  REQUIRE(store->Remove(key).ok());
  CHECK(store->OpenReader(key).status().code() == StatusCode::kNotFound);
  CHECK(Drain(**open) == std::vector<std::string>{"x", "y"});
  CHECK(store->Remove(key).code() == StatusCode::kNotFound);
  CHECK(CountFiles(dir.path() / "outputs") == 0);
}

TEST_CASE("OutputStore.TruncatedFileIsDataLoss" * doctest::timeout(5)) {
  TempDir dir;
  auto store = MakeStore(dir);
  OutputKey key{4, 2, 0, 0};
  WriteAll(*store, key, StorageKind::kFile, {Pattern(10000, 1, 1)});
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path())) {
    if (e.is_regular_file()) std::filesystem::resize_file(e.path(), 5000);
  }
  auto r = store->OpenReader(key);
  REQUIRE(r.ok());
  CHECK(DrainStatus(**r).code() == StatusCode::kDataLoss);
}

TEST_CASE("FileRecordReader.ARecordLongerThanTheRestOfTheFileIsRefusedBeforeItsStorageIsTaken" * doctest::timeout(5)) {
  // A damaged file, or one a peer handed over, whose record header claims 3 GiB: DataLoss at
  // once, not a 3 GiB allocation that a few bytes then fail to fill.
  TempDir dir;
  const auto file = dir.path() / "claims-3-gib";
  std::string bytes(internal::kFileMagic, sizeof internal::kFileMagic);
  char header[internal::kRecordHeaderBytes] = {};
  internal::PutU32(header, 3u << 30);
  bytes.append(header, sizeof header);
  bytes += "abc";
  std::ofstream(file, std::ios::binary) << bytes;
  auto reader = FileRecordReader::Open(file, "claims-3-gib", /*verify=*/true);
  REQUIRE_MESSAGE(reader.ok(), reader.status().ToString());
  auto next = (*reader)->Next();
  REQUIRE_FALSE(next.ok());
  CHECK(next.status().code() == StatusCode::kDataLoss);
  CHECK(next.status().message().find("truncated") != std::string::npos);
}

TEST_CASE("OutputStore.SpillOverBudgetReadsBack" * doctest::timeout(10)) {
  TempDir dir;
  auto store = MakeStore(dir, 1 << 20);  // 1 MiB
  std::vector<std::string> small = {Pattern(300 << 10, 1, 0), Pattern(300 << 10, 1, 1)};
  std::vector<std::string> big;
  for (int i = 0; i < 10; ++i) big.push_back(Pattern(200 << 10, 2, i));
  WriteAll(*store, {5, 0, 0, 0}, StorageKind::kMemory, small);
  CHECK(store->Info({5, 0, 0, 0})->in_memory);
  WriteAll(*store, {5, 1, 0, 0}, StorageKind::kMemory, big);  // does not fit: spills
  auto info = store->Info({5, 1, 0, 0});
  CHECK(!info->in_memory);
  CHECK(info->requested == StorageKind::kMemory);
  CHECK(store->memory_bytes() == (600u << 10));
  CHECK(store->memory_bytes() <= store->memory_budget_bytes());
  CHECK(ReadAll(*store, {5, 0, 0, 0}) == small);
  CHECK(ReadAll(*store, {5, 1, 0, 0}) == big);
  CHECK(CountFiles(dir.path() / "outputs") == 1);
  store->Drop({5, 0, 0, 0});
  CHECK(store->memory_bytes() == 0);
}

TEST_CASE("OutputStore.DropJobDeletesFiles" * doctest::timeout(5)) {
  TempDir dir;
  auto store = MakeStore(dir);
  for (uint32_t v = 0; v < 5; ++v) WriteAll(*store, {6, v, 0, 0}, StorageKind::kFile, {"data", Pattern(100, v, 0)});
  WriteAll(*store, {6, 9, 0, 0}, StorageKind::kMemory, {"mem"});
  WriteAll(*store, {8, 0, 0, 0}, StorageKind::kFile, {"other job"});
  CHECK(CountFiles(dir.path() / "outputs" / "job6") == 5);
  store->DropJob(6);
  CHECK(!std::filesystem::exists(dir.path() / "outputs" / "job6"));
  CHECK(store->List(6).empty());
  CHECK(store->memory_bytes() == 0);
  CHECK(ReadAll(*store, {8, 0, 0, 0}) == std::vector<std::string>{"other job"});
}

TEST_CASE("OutputStore.ADurableCopyOutlivesItsStore" * doctest::timeout(10)) {
  TempDir dir;
  const auto copy = dir.path() / "shared" / "job4" / "v1.1.p0.out";
  const OutputKey key{4, 1, 1, 0};
  const std::vector<std::string> msgs = Messages();
  {
    auto store = MakeStore(dir, 1 << 20);  // a 1 MiB budget: the output spills as well
    auto object = std::make_shared<testing::CountingPayload>(Pattern(5000, 9, 0));
    auto w = store->CreateWriter(key, StorageKind::kMemory, copy);
    REQUIRE_MESSAGE(w.ok(), w.status().ToString());
    REQUIRE((*w)->Write(Buffer(std::shared_ptr<const Payload>(object))).ok());
    for (const auto& m : msgs) REQUIRE((*w)->Write(Buffer(m)).ok());
    CHECK(!std::filesystem::exists(copy));  // complete or nothing, like the output itself
    REQUIRE((*w)->Close().ok());
    REQUIRE(std::filesystem::exists(copy));
    auto expected = msgs;
    expected.insert(expected.begin(), Pattern(5000, 9, 0));
    CHECK(ReadAll(*store, key) == expected);
    auto r = OutputStore::OpenDurableCopy(copy, key);
    REQUIRE_MESSAGE(r.ok(), r.status().ToString());
    CHECK(Drain(**r) == expected);
    store->DropJob(4);  // the store never deletes a copy: whoever named it does
    CHECK(std::filesystem::exists(copy));
    CHECK(!store->CreateWriter({4, 2, 1, 0}, StorageKind::kFile, copy).ok());  // only memory outputs have copies
  }
  // Another process's store reads it where it lies; damage is DataLoss naming the key.
  auto other = MakeStore(dir);
  auto r = OutputStore::OpenDurableCopy(copy, key);
  REQUIRE(r.ok());
  CHECK(Drain(**r).size() == msgs.size() + 1);
  {
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x5a');
  }
  auto bad = OutputStore::OpenDurableCopy(copy, key);
  const Status st = bad.ok() ? DrainStatus(**bad) : bad.status();
  CHECK(st.code() == StatusCode::kDataLoss);
  CHECK(st.message().find(key.ToString()) != std::string::npos);
  std::filesystem::remove(copy);
  auto gone = OutputStore::OpenDurableCopy(copy, key);
  CHECK(!gone.ok());
  CHECK(gone.status().message().find(copy.string()) != std::string::npos);
}

TEST_CASE("OutputStore.AFailingReadContinuesFromTheDurableCopy" * doctest::timeout(10)) {
  TempDir dir;
  auto store = MakeStore(dir);
  const auto copy = dir.path() / "shared" / "v1.1.p0.out";
  const OutputKey key{4, 1, 1, 0};
  const std::vector<std::string> msgs = {"m0", Pattern(100000, 1, 1), "m2", "m3"};
  auto w = store->CreateWriter(key, StorageKind::kMemory, copy);
  REQUIRE(w.ok());
  for (const auto& m : msgs) REQUIRE((*w)->Write(Buffer(m)).ok());
  REQUIRE((*w)->Close().ok());
  /// Delivers the first `good` messages, then fails as a damaged or cut-off read does.
  class Failing final : public ChannelReader {
   public:
    Failing(std::vector<std::string> m, size_t good) : m_(std::move(m)), good_(good) {}
    Result<std::optional<Buffer>> Next() override {
      if (next_ == good_) return Status::DataLoss("message " + std::to_string(next_) + " failed its checksum");
      return std::optional<Buffer>(Buffer(m_[next_++]));
    }

   private:
    std::vector<std::string> m_;
    size_t good_, next_ = 0;
  };
  for (size_t good : {size_t{0}, size_t{2}}) {
    auto r = OutputStore::WithDurableFallback(std::make_unique<Failing>(msgs, good), copy, key);
    CHECK(Drain(*r) == msgs);  // every message once, in order
  }
  // Without a readable copy the read fails, naming both causes.
  std::filesystem::remove(copy);
  auto r = OutputStore::WithDurableFallback(std::make_unique<Failing>(msgs, 1), copy, key);
  const Status st = DrainStatus(*r);
  CHECK(st.code() == StatusCode::kDataLoss);
  CHECK(st.message().find("failed its checksum") != std::string::npos);
  CHECK(st.message().find(copy.string()) != std::string::npos);
}

TEST_CASE("OutputStore.ConcurrentWritersAndReaders" * doctest::timeout(20)) {
  TempDir dir;
  auto store = MakeStore(dir, 4 << 20);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t i = 0; i < 50; ++i) {
        OutputKey key{9, static_cast<uint32_t>(t), i, 0};
        std::vector<std::string> msgs = {Pattern(50000, t, i), Pattern(10, t, i + 1000)};
        auto w = store->CreateWriter(key, i % 2 ? StorageKind::kMemory : StorageKind::kFile);
        if (!w.ok()) {
          ++failures;
          continue;
        }
        for (auto& m : msgs) (void)(*w)->Write(Buffer(m));
        if (!(*w)->Close().ok()) ++failures;
        auto r = store->OpenReader(key);
        if (!r.ok()) {
          ++failures;
          continue;
        }
        std::vector<std::string> got;
        for (;;) {
          auto m = (*r)->Next();
          if (!m.ok() || !m->has_value()) break;
          got.emplace_back((*m)->view());
        }
        if (got != msgs) ++failures;
        if (i % 3 == 0) store->Drop(key);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  store->DropJob(9);
  CHECK(store->memory_bytes() == 0);
}

TEST_CASE("OutputStore.MakeKeepsTheCompleteFileOutputsOfAnEarlierProcess" * doctest::timeout(10)) {
  TempDir dir;
  const OutputKey kept{1, 3, 2, 1}, truncated{1, 4, 1, 0}, other_job{7, 0, 5, 0};
  const std::vector<std::string> messages = Messages();
  {
    auto store = MakeStore(dir);
    WriteAll(*store, kept, StorageKind::kFile, messages);
    WriteAll(*store, truncated, StorageKind::kFile, {Pattern(10000, 1, 1), "tail"});
    WriteAll(*store, other_job, StorageKind::kFile, {"x"});
    WriteAll(*store, {1, 5, 1, 0}, StorageKind::kMemory, {"gone with the process"});
    WriteAll(*store, {1, 6, 1, 0}, StorageKind::kFile, {});  // empty: no file, nothing to keep
  }
  const auto job1 = dir.path() / "outputs" / "job1";
  for (const auto& e : std::filesystem::directory_iterator(job1)) {
    if (e.path().filename().string().rfind("v4.", 0) == 0) std::filesystem::resize_file(e.path(), 5000);
  }
  std::ofstream(job1 / "v8.1.p0.9.out.tmp") << "a writer killed mid-output";
  std::ofstream(job1 / "v9.1.p0.10.out") << "not an output file at all";
  std::filesystem::create_directories(dir.path() / "outputs" / "keepme");

  auto store = MakeStore(dir);
  CHECK(store->List() == std::vector<OutputKey>{kept, other_job});
  CHECK(ReadAll(*store, kept) == messages);
  CHECK(ReadAll(*store, other_job) == std::vector<std::string>{"x"});
  auto info = store->Info(kept);
  REQUIRE(info.ok());
  CHECK(info->messages == messages.size());
  uint64_t bytes = 0;
  for (const auto& m : messages) bytes += m.size();
  CHECK(info->bytes == bytes);
  CHECK(info->requested == StorageKind::kFile);
  CHECK(CountFiles(job1, ".out") == 1);  // the truncated file and the one that is not an output went...
  const auto damaged = dir.path() / "outputs" / OutputStore::kDamagedDir / "job1";
  CHECK(CountFiles(damaged, ".out") == 2);  // ...aside, for a person, not deleted
  std::stringstream foreign;
  foreign << std::ifstream(damaged / "v9.1.p0.10.out").rdbuf();
  CHECK(foreign.str() == "not an output file at all");
  CHECK(CountFiles(dir.path() / "outputs", ".tmp") == 0);
  CHECK(std::filesystem::exists(dir.path() / "outputs" / "keepme"));

  // Adopted outputs live beside new ones and are dropped like them.
  WriteAll(*store, {1, 3, 2, 2}, StorageKind::kFile, {"new"});
  CHECK(ReadAll(*store, kept) == messages);
  CHECK(store->CreateWriter(kept, StorageKind::kFile).status().code() == StatusCode::kAlreadyExists);
  store->DropJob(1);
  CHECK(CountFiles(dir.path() / "outputs" / "job7", ".out") == 1);
  CHECK(MakeStore(dir)->List() == std::vector<OutputKey>{other_job});  // what was set aside is not adopted later

  // What is set aside goes after kDamagedKeepDays.
  std::filesystem::last_write_time(damaged / "v9.1.p0.10.out", std::filesystem::file_time_type::clock::now() -
                                                                   std::chrono::hours(24 * OutputStore::kDamagedKeepDays + 1));
  MakeStore(dir);
  CHECK(CountFiles(damaged, ".out") == 1);
  CHECK(!std::filesystem::exists(damaged / "v9.1.p0.10.out"));
}

TEST_CASE("OutputStore.DamagedFilesSetAsideAreBoundedInBytesTheNewestKept") {
  TempDir dir;
  const auto aside = dir.path() / "outputs" / OutputStore::kDamagedDir / "job3";
  std::filesystem::create_directories(aside);
  const uint64_t part = OutputStore::kDamagedMaxBytes / 2 + 1;  // two of them do not fit
  const auto now = std::filesystem::file_time_type::clock::now();
  for (int i = 0; i < 3; ++i) {
    const auto file = aside / ("v" + std::to_string(i) + ".out");
    std::ofstream(file).close();
    std::filesystem::resize_file(file, part);  // sparse: no disk used
    std::filesystem::last_write_time(file, now - std::chrono::minutes(10 - i));
  }
  MakeStore(dir);
  CHECK(CountFiles(aside, ".out") == 1);
  CHECK(std::filesystem::exists(aside / "v2.out"));  // the newest
}

TEST_CASE("OutputStore.AnOutputFileWithTrailingBytesIsSetAside" * doctest::timeout(10)) {
  TempDir dir;
  WriteAll(*MakeStore(dir), {1, 0, 1, 0}, StorageKind::kFile, {"whole", "records"});
  const auto job1 = dir.path() / "outputs" / "job1";
  std::filesystem::path file;
  for (const auto& e : std::filesystem::directory_iterator(job1)) file = e.path();
  std::ofstream(file, std::ios::app) << "garbage";  // trailing bytes that are no whole record
  auto store = MakeStore(dir);
  CHECK(store->List().empty());
  const auto aside = dir.path() / "outputs" / OutputStore::kDamagedDir / "job1" / file.filename();
  CHECK(std::filesystem::exists(aside));
  // The same name damaged again later (job ids start again with a new job manager's state):
  // set aside beside the first, not over it.
  store.reset();
  std::filesystem::copy_file(aside, file);
  CHECK(MakeStore(dir)->List().empty());
  CHECK(std::filesystem::exists(aside));
  CHECK(std::filesystem::exists(aside.string() + ".1"));
}

TEST_CASE("OutputStore.MakeRemovesOutputsWrittenBeforeTheMachineRebooted" * doctest::timeout(10)) {
  TempDir dir;
  WriteAll(*MakeStore(dir), {1, 0, 1, 0}, StorageKind::kFile, {"x"});
  CHECK(MakeStore(dir)->List().size() == 1);  // same boot: kept
  std::ofstream(dir.path() / "outputs" / "boot_id") << "another-boot\n";
  CHECK(MakeStore(dir)->List().empty());  // unsynced files of an earlier boot: removed
  CHECK(CountFiles(dir.path() / "outputs", ".out") == 0);
}

}  // namespace copse::chan
