#pragma once
// Child processes for multi-process tests: the test binary re-executes itself as
// `<binary> --copse-child NAME` and runs the body registered under NAME, so a child never
// inherits a fork of this multi-threaded process (locks held by threads that do not exist in
// the child, a ZeroMQ or logger state mid-update). Parent and child exchange length-prefixed
// strings: the child reads from its stdin, writes to fd 3.
#include <sys/types.h>

#include <string>

namespace copse::testing {

/// A child's body; its return value is the child's exit status.
using ChildBody = int (*)();

/// Registers `body` under `name` at static-initialization time (see COPSE_TEST_CHILD).
struct ChildRegistrar {
  ChildRegistrar(const char* name, ChildBody body);
};

/// Defines a child body named `name` (a C++ identifier), runnable with ChildProcess("name").
#define COPSE_TEST_CHILD(name)                                                                           \
  static int CopseChild_##name();                                                                        \
  static const ::copse::testing::ChildRegistrar copse_child_registrar_##name{#name, &CopseChild_##name}; \
  static int CopseChild_##name()

/// Runs the body registered under `name`; called by main() for `--copse-child NAME`.
int RunChild(const std::string& name);

/// In a child: the next string from the parent ("" at end of input); a string to the parent.
std::string ReceiveFromParent();
bool SendToParent(const std::string& text);

/// A running child. Killed (SIGKILL) and reaped by the destructor if still running.
class ChildProcess {
 public:
  explicit ChildProcess(const std::string& name);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  void Send(const std::string& text);
  /// The child's next string; fails the test if the child ended without sending one.
  std::string Receive();
  /// Waits for the child to end; its wait status. Once only.
  int Wait();
  /// SIGKILL and reap (nothing once reaped).
  void Kill();

 private:
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
};

}  // namespace copse::testing
