#!/bin/sh
# Fails when a source file is not formatted as .clang-format says (clang-format 14, Debian's:
# another version formats some constructs differently, so the check is skipped there, exit 77).
# Format the tree with: scripts/check_format.sh --fix
root=$(cd "$(dirname "$0")/.." && pwd)
command -v clang-format > /dev/null || { echo "check_format: clang-format not installed; skipped"; exit 77; }
version=$(clang-format --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
[ "$version" = 14 ] || { echo "check_format: clang-format $version, not 14; skipped"; exit 77; }
files=$(cd "$root" && find common protocol channels vertex jobmanager ml cli tests bench fuzz \( -name '*.h' -o -name '*.cc' -o -name '*.cu' \) | sort)
cd "$root" || exit 1
if [ "$1" = "--fix" ]; then
  echo "$files" | xargs clang-format -i
  exit 0
fi
echo "$files" | xargs clang-format --dry-run --Werror 2> /tmp/check_format.$$
status=$?
grep -E "^[^ ].*: error:" /tmp/check_format.$$ | sed 's/:[0-9]*:[0-9]*: error:.*//' | sort -u | head -20
rm -f /tmp/check_format.$$
[ $status -eq 0 ] && echo "check_format: every file is formatted" || echo "check_format: run scripts/check_format.sh --fix"
exit $status
