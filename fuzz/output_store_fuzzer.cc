// Fuzzes a daemon's restart on a work dir an earlier process left (channels/output_store.h):
// the output store adopts the output files it finds, sets damaged ones aside and removes the
// rest, then serves what it adopted. The input is up to four files, each
//   u8 flags | u8 name length | name | u16 content length (little-endian) | content
// flags bit 0: the file goes in job1/ (else job2/); bit 1: the content follows the output
// file magic; bit 2: every whole record's checksum is made right (so reads get past it). Name
// characters outside [A-Za-z0-9._-] become '_' (a file name, not a path).
// Properties beyond "no crash, no sanitizer report": every adopted output reads to its end
// with the message and byte counts the store listed, or fails with DataLoss; a file not
// adopted is gone from the job's directory (set aside or removed); a second restart adopts
// exactly the outputs the first one did.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "channels/output_store.h"
#include "channels/record_format.h"
#include "common/logging.h"
#include "fuzz/fuzz_check.h"

namespace fs = std::filesystem;

namespace {

fs::path g_dir;
std::string g_boot_id;

void FixChecksums(std::string& content, size_t from) {
  size_t at = from;
  while (at + copse::chan::internal::kRecordHeaderBytes <= content.size()) {
    const uint32_t length = copse::chan::internal::GetU32(content.data() + at);
    const size_t body = at + copse::chan::internal::kRecordHeaderBytes;
    if (length > content.size() - body) return;
    const uint64_t sum = copse::chan::internal::Checksum(std::string_view(content.data() + body, length));
    copse::chan::internal::PutU64(content.data() + at + 4, sum);
    at = body + length;
  }
}

std::vector<copse::chan::OutputKey> Adopt(std::vector<copse::chan::OutputInfo>* infos) {
  auto store = copse::chan::OutputStore::Make(g_dir, 1 << 20);
  COPSE_FUZZ_CHECK(store.ok());
  std::vector<copse::chan::OutputKey> keys = (*store)->List();
  for (const auto& key : keys) {
    auto info = (*store)->Info(key);
    COPSE_FUZZ_CHECK(info.ok());
    if (infos) infos->push_back(*info);
    auto reader = (*store)->OpenReader(key);
    if (!reader.ok()) {
      COPSE_FUZZ_CHECK(reader.status().code() == copse::StatusCode::kDataLoss);
      continue;
    }
    uint64_t messages = 0, bytes = 0;
    bool failed = false;
    for (;;) {
      auto next = (*reader)->Next();
      if (!next.ok()) {
        COPSE_FUZZ_CHECK(next.status().code() == copse::StatusCode::kDataLoss);
        failed = true;
        break;
      }
      if (!next->has_value()) break;
      ++messages;
      bytes += (*next)->size();
    }
    if (!failed) {
      COPSE_FUZZ_CHECK(messages == info->messages);
      COPSE_FUZZ_CHECK(bytes == info->bytes);
    }
  }
  return keys;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  copse::SetLogLevel("off");
  const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  g_dir = base / ("copse-fuzz-output-store-" + std::to_string(::getpid()));
  std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), g_boot_id);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::error_code ec;
  fs::remove_all(g_dir, ec);
  fs::create_directories(g_dir / "job1");
  fs::create_directories(g_dir / "job2");
  // Outputs are adopted only when written since this boot (the store's own record of it).
  std::ofstream(g_dir / "boot_id") << g_boot_id << "\n";
  std::string_view in(reinterpret_cast<const char*>(data), size);
  for (int file = 0; file < 4 && in.size() >= 2; ++file) {
    const uint8_t flags = static_cast<uint8_t>(in[0]);
    const size_t name_length = std::min<size_t>(static_cast<uint8_t>(in[1]) % 64, in.size() - 2);
    std::string name(in.substr(2, name_length));
    in.remove_prefix(2 + name_length);
    for (char& c : name) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
    }
    if (name.empty() || name == "." || name == "..") name = "_";
    size_t content_length = 0;
    if (in.size() >= 2) {
      content_length = std::min<size_t>(static_cast<uint8_t>(in[0]) | (static_cast<uint8_t>(in[1]) << 8), in.size() - 2);
      in.remove_prefix(2);
    }
    std::string content;
    if (flags & 2) content.assign(copse::chan::internal::kFileMagic, sizeof copse::chan::internal::kFileMagic);
    const size_t header = content.size();
    content.append(in.substr(0, content_length));
    in.remove_prefix(content_length);
    if (flags & 4) FixChecksums(content, header);
    const fs::path path = g_dir / ((flags & 1) ? "job1" : "job2") / name;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
  }

  std::vector<copse::chan::OutputInfo> first_infos;
  const std::vector<copse::chan::OutputKey> first = Adopt(&first_infos);
  size_t left = 0;  // files in the jobs' directories: exactly the adopted outputs
  for (const char* job : {"job1", "job2"}) {
    for (const auto& entry : fs::directory_iterator(g_dir / job, ec)) left += entry.is_regular_file() ? 1 : 100;
  }
  COPSE_FUZZ_CHECK(left == first.size());
  std::vector<copse::chan::OutputInfo> second_infos;
  const std::vector<copse::chan::OutputKey> second = Adopt(&second_infos);
  COPSE_FUZZ_CHECK(first == second);
  COPSE_FUZZ_CHECK(first_infos.size() == second_infos.size());
  for (size_t i = 0; i < first_infos.size(); ++i) {
    COPSE_FUZZ_CHECK(first_infos[i].messages == second_infos[i].messages);
    COPSE_FUZZ_CHECK(first_infos[i].bytes == second_infos[i].bytes);
  }
  return 0;
}
