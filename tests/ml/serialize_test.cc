#include <doctest/doctest.h>

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "ml/serialize.h"
#include "ml/tensor_message.h"
#include "tests/ml/test_util.h"

using namespace copse::ml;
using copse::ml::testing::RandomTensor;
namespace chan = copse::chan;

TEST_CASE("Serialize.RoundTripsTensorsBitExactly") {
  NamedTensors in{
      {"0.weight", RandomTensor({3, 4}, 1)}, {"scalar", Tensor::FromVector({}, {2.5f})}, {"empty", Tensor::Zeros({0, 5})}};
  const std::string bytes = SerializeTensors(in);
  auto out = DeserializeTensors(bytes);
  REQUIRE(out.ok());
  REQUIRE(out->size() == 3);
  for (size_t i = 0; i < in.size(); ++i) {
    CHECK((*out)[i].first == in[i].first);
    CHECK((*out)[i].second.BitwiseEquals(in[i].second));
  }
  auto one = DeserializeTensor(SerializeTensor(in[0].second));
  REQUIRE(one.ok());
  CHECK(one->BitwiseEquals(in[0].second));
  CHECK(Digest(in) == Digest(*out));
}

TEST_CASE("Serialize.CorruptionIsDataLossNeverACrash") {
  const std::string good = SerializeTensors({{"w", RandomTensor({2, 3}, 2)}});
  // Every single-byte flip and every truncation is detected.
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x5A);
    auto r = DeserializeTensors(bad);
    CHECK(r.status().code() == copse::StatusCode::kDataLoss);
    auto t = DeserializeTensors(std::string_view(good).substr(0, i));
    CHECK(t.status().code() == copse::StatusCode::kDataLoss);
  }
  CHECK(DeserializeTensors(good + "x").status().code() == copse::StatusCode::kDataLoss);
  CHECK(DeserializeTensors("").status().message().find("truncated") != std::string::npos);
  // Dimensions whose product wraps round 2^64 (64 x 5·2^60) behind a zero one: refused, not an
  // empty tensor whose element count overflows (the tensor fuzzer's find).
  std::string wrapped = SerializeTensors({{"w", Tensor::Zeros({0, 1, 1})}});
  const size_t dims = wrapped.size() - 8 - 3 * 8;  // before the checksum: three int64 dimensions
  for (auto [i, d] : {std::pair{0, int64_t{64}}, {1, int64_t{5} << 60}, {2, int64_t{0}}})
    std::memcpy(wrapped.data() + dims + 8 * i, &d, 8);
  const uint64_t sum = XXH64(wrapped.data(), wrapped.size() - 8, 0);
  std::memcpy(wrapped.data() + wrapped.size() - 8, &sum, 8);
  auto huge = DeserializeTensors(wrapped);
  CHECK(huge.status().code() == copse::StatusCode::kDataLoss);
  CHECK_MESSAGE(huge.status().message().find("shape too large") != std::string::npos, huge.status().ToString());
  // Two tensors where one is expected.
  const std::string two = SerializeTensors({{"a", Tensor::Zeros({1})}, {"b", Tensor::Zeros({1})}});
  CHECK(DeserializeTensor(two).status().code() == copse::StatusCode::kDataLoss);
}

TEST_CASE("Serialize.SpansAreTheEncodingWithTheTensorsInPlace") {
  const NamedTensors sets[] = {
      {{"0.weight", RandomTensor({3, 4}, 1)}, {"empty", Tensor::Zeros({0, 5})}, {"", RandomTensor({7}, 2)}},
      {},  // no tensors: the prefix and the trailer
  };
  for (const NamedTensors& in : sets) {
    std::string headers;
    const std::vector<std::string_view> spans = SerializedSpans(in, &headers);
    std::string joined;
    for (std::string_view s : spans) joined += s;
    CHECK(joined == SerializeTensors(in));
    for (const auto& [name, t] : in) {  // the data is not copied: some span points at it
      if (t.bytes() == 0) continue;
      CHECK(std::any_of(spans.begin(), spans.end(), [&](std::string_view s) {
        return s.data() == reinterpret_cast<const char*>(t.data()) && s.size() == t.bytes();
      }));
    }
  }
}

TEST_CASE("Serialize.AnUndefinedTensorGoesOnTheWireAsAnEmptyOne") {
  // An undefined tensor has no storage, yet its product of no dimensions says one element:
  // encoding it read 4 bytes through a null pointer, and a daemon's data server, sending a
  // message that held one, crashed the daemon.
  const NamedTensors in{{"undefined", Tensor()}, {"x", RandomTensor({2}, 3)}};
  const std::string bytes = SerializeTensors(in);
  CHECK(bytes.size() == EncodedSize(in));
  std::string headers;
  std::string joined;
  for (std::string_view span : SerializedSpans(in, &headers)) joined += span;
  CHECK(joined == bytes);
  auto out = DeserializeTensors(bytes);
  REQUIRE(out.ok());
  CHECK((*out)[0].second.shape() == Shape{0});
  CHECK((*out)[1].second.BitwiseEquals(in[1].second));
}

TEST_CASE("TensorMessage.LocalReadersShareTheTensorsAndRemoteOnesGetTheSameBytes") {
  const NamedTensors in = {{"w", RandomTensor({3, 4}, 5)}, {"b", RandomTensor({4}, 6)}};
  const chan::Buffer msg = TensorMessage(in);
  bool shared = false;
  auto local = ReadTensorMessage(msg, &shared);
  REQUIRE(local.ok());
  CHECK(shared);
  CHECK((*local)[0].second.data() == in[0].second.data());  // the very tensors: no copy
  CHECK(msg.size() == SerializeTensors(in).size());         // known without encoding
  CHECK(msg.view() == SerializeTensors(in));                // what a remote reader receives
  std::string spanned;
  for (std::string_view s : msg.spans()) spanned += s;  // what a fetch sends, gathered in place
  CHECK(spanned == SerializeTensors(in));
  auto remote = ReadTensorMessage(chan::Buffer(std::string(msg.view())), &shared);
  REQUIRE(remote.ok());
  CHECK(!shared);
  CHECK(Digest(*remote) == Digest(in));
  // Cache keys: stable per message, distinct between messages and between an object and bytes.
  const chan::Buffer again = TensorMessage(in);
  CHECK(TensorMessageKey(msg) == TensorMessageKey(msg));
  CHECK(TensorMessageKey(msg) != TensorMessageKey(again));
  CHECK(TensorMessageKey(msg) != TensorMessageKey(chan::Buffer(std::string(msg.view()))));
  // One tensor: SerializeTensor's encoding.
  const chan::Buffer one = SingleTensorMessage(in[1].second);
  CHECK(one.view() == SerializeTensor(in[1].second));
  CHECK(ReadSingleTensor(one)->data() == in[1].second.data());
  CHECK(ReadSingleTensor(msg).status().code() == copse::StatusCode::kDataLoss);
}
