#pragma once
// Small text helpers shared by every module that reports user errors.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace copse {

/// Edit distance (insert, delete, substitute) between two strings.
size_t EditDistance(std::string_view a, std::string_view b);

/// The candidate closest to `word` when it is plausibly a typo of it (distance at most a third of
/// the word's length, at least 1), or "" when none is close.
std::string DidYouMean(std::string_view word, const std::vector<std::string>& candidates);

/// 1-based line and column of byte `offset` in `text`.
struct LineColumn {
  size_t line = 1;
  size_t column = 1;
};
LineColumn LineColumnAt(std::string_view text, size_t offset);

/// Replaces every occurrence of `from` in `s` with `to`.
std::string ReplaceAll(std::string s, std::string_view from, std::string_view to);

/// Joins `parts` with `sep`.
std::string Join(const std::vector<std::string>& parts, std::string_view sep);

/// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF):
/// what protocol buffers' text fields must hold.
bool IsValidUtf8(std::string_view s);

}  // namespace copse
