#pragma once
// Strong id types for everything that crosses a process boundary. A JobId can never be passed
// where a VertexId is expected; all are plain integers on the wire.
#include <cstdint>
#include <functional>
#include <string>

namespace copse {

template <typename Tag, typename Rep = uint32_t>
class StrongId {
 public:
  using rep_type = Rep;
  constexpr StrongId() = default;
  constexpr explicit StrongId(Rep v) : v_(v) {}
  constexpr Rep value() const { return v_; }
  constexpr bool valid() const { return v_ != kInvalid; }
  static constexpr StrongId Invalid() { return StrongId(); }
  friend constexpr auto operator<=>(StrongId, StrongId) = default;
  std::string ToString() const { return std::to_string(v_); }

 private:
  static constexpr Rep kInvalid = static_cast<Rep>(-1);
  Rep v_ = kInvalid;
};

using JobId = StrongId<struct JobIdTag, uint64_t>;
using VertexId = StrongId<struct VertexIdTag>;    // index into a job's expanded graph
using ChannelId = StrongId<struct ChannelIdTag>;  // index into a job's expanded graph
using StageId = StrongId<struct StageIdTag>;
using GangId = StrongId<struct GangIdTag>;
using DaemonId = StrongId<struct DaemonIdTag>;

}  // namespace copse

template <typename Tag, typename Rep>
struct std::hash<copse::StrongId<Tag, Rep>> {
  size_t operator()(copse::StrongId<Tag, Rep> id) const noexcept { return std::hash<Rep>()(id.value()); }
};
