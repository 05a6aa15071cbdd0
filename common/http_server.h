#pragma once
// HttpServer: a small HTTP/1.1 server on its own threads, for the job manager's API and
// dashboard and the daemons' metrics. The parsing, keep-alive and chunked transfer are
// cpp-httplib's (Debian libcpp-httplib-dev); this class adds what every copse endpoint shares:
//
//  * Authentication with the cluster secret. Two levels of access: a *viewer* reads (every GET),
//    an *admin* also acts (cancel, chaos). The admin credentials are the secret itself and a
//    token derived from it (AdminToken: what links carry, so that the secret, which also lets
//    its holder submit jobs on the control port, never appears in a URL); the viewer credential
//    is another derived token (ViewerToken), which can be handed out without the power to act.
//    Each is presented as `Authorization: Bearer <credential>`, or once to POST /api/v1/login,
//    which sets an HttpOnly, SameSite=Strict session cookie for browsers. A POST that relies on
//    the cookie must also carry the header `X-Copse-Request: 1`, which a page of another origin
//    cannot send without the preflight this server never grants (cross-site request forgery
//    from another port of the same host included).
//  * Bounded cost: at most kMaxStreams long-lived streams (Server-Sent Events) at once, each on
//    its own worker thread, ended when the server stops; other requests keep the rest.
//
// Handlers run on the server's worker threads, never on the caller's; they must be thread-safe.
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace copse::http {

enum class Access { kNone = 0, kViewer = 1, kAdmin = 2 };

/// The viewer and admin credentials (for links and programs) of a cluster whose secret is `secret`.
std::string ViewerToken(std::string_view secret);
std::string AdminToken(std::string_view secret);
/// Who presents `credential` (a bearer token or a session cookie's value).
Access AccessOf(std::string_view credential, std::string_view secret);

struct Request {
  std::string method;
  std::string path;
  std::vector<std::string> matches;                // the path pattern's groups (matches[1] is the first)
  std::multimap<std::string, std::string> params;  // the query string's
  std::string body;
  Access access = Access::kNone;
  /// The query parameter `key`, or `fallback` when absent.
  std::string Param(const std::string& key, const std::string& fallback = "") const;
};

/// Writes one chunk of a stream; false once the client has gone or the server stops.
using StreamWrite = std::function<bool(std::string_view chunk)>;

struct Response {
  int status = 200;
  std::string content_type = "application/json; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  /// Set for a stream (Server-Sent Events): called once on a worker thread with a writer, and
  /// returns when it is done or a write fails. `body` is then ignored.
  std::function<void(const StreamWrite& write)> stream;
  static Response Json(int status, std::string body);
  /// {"error": message} with `status`.
  static Response Error(int status, const std::string& message);
};

using Handler = std::function<Response(const Request&)>;

class HttpServer {
 public:
  static constexpr int kMaxStreams = 8;
  static constexpr int kWorkerThreads = 16;

  /// `secret`: the cluster's; requests without a credential get 401 (except Public routes).
  explicit HttpServer(std::string secret);
  ~HttpServer();  // stops
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// Routes, before Listen. `pattern` is an ECMAScript regex matched against the whole path.
  void Get(const std::string& pattern, Access needed, Handler handler);
  void Post(const std::string& pattern, Access needed, Handler handler);
  /// A GET anyone may fetch (the dashboard's page and scripts, which hold no data).
  void Public(const std::string& pattern, Handler handler) { Get(pattern, Access::kNone, std::move(handler)); }

  /// Binds `host`:`port` (0: any free port) and serves on worker threads from now on.
  /// `what` names the flag for errors ("--http").
  Status Listen(const std::string& host, uint16_t port, const std::string& what);
  uint16_t port() const { return port_; }
  /// Stops accepting, ends the streams and waits for the workers. Idempotent.
  void Stop();
  /// Whether Stop was called (streams poll it between writes).
  bool stopping() const { return stopping_.load(); }

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> stopping_{false};
  uint16_t port_ = 0;
};

}  // namespace copse::http
