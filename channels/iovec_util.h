#pragma once
// Scatter-gather write bookkeeping shared by the file (writev) and socket (sendmsg) paths.
#include <sys/uio.h>

#include <cstddef>

namespace copse::chan {

/// After a scatter write that wrote `written` bytes of `iov[0..count)`, moves `iov` and
/// `count` past what was written, leaving the first remaining buffer partially consumed.
template <typename Count>
void AdvanceIovec(iovec*& iov, Count& count, size_t written) {
  while (count > 0 && written >= iov->iov_len) {
    written -= iov->iov_len;
    ++iov;
    --count;
  }
  if (count > 0) {
    iov->iov_base = static_cast<char*>(iov->iov_base) + written;
    iov->iov_len -= written;
  }
}

}  // namespace copse::chan
