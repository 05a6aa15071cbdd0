// Fuzzes the decoding of tensors (ml/serialize.h): what a consumer reads from another daemon,
// a spilled output, a stream or a checkpoint file. The first input byte chooses how the rest
// is used: as the whole encoding (so checksum failures are covered), or as everything but its
// checksum trailer, which the harness appends (so the header, names, dtypes and dimension
// checks behind the checksum are reached too).
// Properties beyond "no crash, no sanitizer report, no allocation beyond the input's size":
// what decodes encodes to bytes that decode to bit-identical tensors, and a set of one tensor
// reads the same as a set and as a single tensor.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "channels/buffer.h"
#include "common/logging.h"
#include "fuzz/fuzz_check.h"
#include "ml/serialize.h"
#include "ml/tensor_message.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  copse::SetLogLevel("off");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool append_checksum = data[0] & 1;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (append_checksum) {
    const uint64_t sum = copse::ml::Checksum(bytes);
    char trailer[8];
    std::memcpy(trailer, &sum, 8);
    bytes.append(trailer, 8);
  }
  auto tensors = copse::ml::DeserializeTensors(bytes);
  auto single = copse::ml::DeserializeTensor(bytes);
  auto message = copse::ml::ReadTensorMessage(copse::chan::Buffer::Copy(bytes));
  COPSE_FUZZ_CHECK(tensors.ok() == message.ok());
  if (!tensors.ok()) {
    COPSE_FUZZ_CHECK(!single.ok());
    return 0;
  }
  const std::string digest = copse::ml::Digest(*tensors);
  COPSE_FUZZ_CHECK(copse::ml::Digest(*message) == digest);
  const std::string encoded = copse::ml::SerializeTensors(*tensors);
  COPSE_FUZZ_CHECK(encoded.size() == copse::ml::EncodedSize(*tensors));
  auto again = copse::ml::DeserializeTensors(encoded);
  COPSE_FUZZ_CHECK(again.ok());
  COPSE_FUZZ_CHECK(copse::ml::Digest(*again) == digest);
  if (single.ok()) {
    COPSE_FUZZ_CHECK(tensors->size() == 1);
    auto single_again = copse::ml::DeserializeTensor(copse::ml::SerializeTensor(*single));
    COPSE_FUZZ_CHECK(single_again.ok());
    COPSE_FUZZ_CHECK(copse::ml::Digest({{"", *single_again}}) == copse::ml::Digest({{"", *single}}));
  }
  return 0;
}
