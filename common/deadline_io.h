#pragma once
// Blocking connect, read and write on an asio socket, each bounded by a deadline: for the
// short synchronous conversations of the control plane (a daemon registering, a CLI's
// request), where a peer that accepts and then says nothing, or an address that drops SYNs,
// must cost a bounded wait rather than a thread for ever. asio's own synchronous calls have no
// timeout (they poll without one even under SO_RCVTIMEO), so each call starts the asynchronous
// operation and runs the socket's io_context until it completes or the deadline passes, then
// closes the socket.
//
// The io_context must be one only this thread runs, with no other work in it that could run
// meanwhile (typically one made for the conversation; the socket can be handed to another
// io_context afterwards through release()). After a timeout the socket is closed.
#include <chrono>
#include <system_error>

#include <asio.hpp>

namespace copse::net {

using Deadline = std::chrono::steady_clock::time_point;

namespace internal {

/// Runs `start(handler)`'s operation on `io` until it completes or `deadline` passes; its error,
/// or asio::error::timed_out.
template <class Socket, class Start>
std::error_code RunBefore(asio::io_context& io, Socket& socket, Deadline deadline, Start start) {
  std::error_code result = asio::error::would_block;
  bool done = false;
  start([&](std::error_code ec, auto&&...) {
    result = ec;
    done = true;
  });
  io.restart();
  io.run_until(deadline);
  if (done) return result;
  // Closed, not cancelled: a composed read or write between two of its steps has nothing for
  // cancel() to reach, and its next step would start a wait no one ends; on a closed socket
  // that step fails at once.
  std::error_code ignored;
  socket.close(ignored);
  io.restart();
  io.run();  // the operation's handler, with operation_aborted or bad_descriptor
  return asio::error::timed_out;
}

}  // namespace internal

template <class Socket, class Endpoint>
std::error_code ConnectBefore(asio::io_context& io, Socket& socket, const Endpoint& to, Deadline deadline) {
  return internal::RunBefore(io, socket, deadline, [&](auto handler) { socket.async_connect(to, handler); });
}

/// Reads exactly asio::buffer_size(into) bytes.
template <class Socket>
std::error_code ReadBefore(asio::io_context& io, Socket& socket, asio::mutable_buffer into, Deadline deadline) {
  return internal::RunBefore(io, socket, deadline, [&](auto handler) { asio::async_read(socket, into, handler); });
}

/// Reads what has arrived (at least one byte) into `into`; `got` is set to the bytes read.
template <class Socket>
std::error_code ReadSomeBefore(asio::io_context& io, Socket& socket, asio::mutable_buffer into, Deadline deadline, size_t& got) {
  got = 0;
  return internal::RunBefore(io, socket, deadline, [&](auto handler) {
    socket.async_read_some(into, [&got, handler](std::error_code ec, size_t n) mutable {
      got = n;
      handler(ec);
    });
  });
}

/// Writes all of `from`.
template <class Socket>
std::error_code WriteBefore(asio::io_context& io, Socket& socket, asio::const_buffer from, Deadline deadline) {
  return internal::RunBefore(io, socket, deadline, [&](auto handler) { asio::async_write(socket, from, handler); });
}

}  // namespace copse::net
