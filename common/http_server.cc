#include "common/http_server.h"

#include <strings.h>

#include <chrono>
#include <thread>
#include <vector>

#include <httplib.h>

#include "common/auth.h"
#include "common/json_util.h"

namespace copse::http {
namespace {

constexpr std::string_view kCookieName = "copse_session";
/// With its charset, JSON is not what cpp-httplib compresses (it matches "application/json"
/// exactly): its Brotli, at quality 11, took a third of the job manager's CPU while a dashboard
/// polled a running job's timeline. Answers stay small (aggregates, pages, the newest spans).
constexpr const char* kJsonType = "application/json; charset=utf-8";

/// A session cookie's value for `access`: the level, then a MAC only the secret's holder makes.
std::string SessionValue(Access access, std::string_view secret) {
  const std::string role = access == Access::kAdmin ? "admin" : "viewer";
  return role + "." + auth::Mac(secret, "copse-http-session/" + role);
}

std::vector<std::string> CookieValues(const httplib::Request& req) {
  std::vector<std::string> values;
  const std::string cookies = req.get_header_value("Cookie");
  size_t at = 0;
  while (at < cookies.size()) {
    size_t end = cookies.find(';', at);
    if (end == std::string::npos) end = cookies.size();
    std::string_view part(cookies.data() + at, end - at);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    if (part.size() > kCookieName.size() && part.substr(0, kCookieName.size()) == kCookieName &&
        part[kCookieName.size()] == '=') {
      values.emplace_back(part.substr(kCookieName.size() + 1));
    }
    at = end + 1;
  }
  return values;
}

/// The access the request's session cookies give: the best of them (another service of the same
/// host can set a cookie of this name too: one bad cookie must not hide a good one).
Access CookieAccess(const httplib::Request& req, std::string_view secret) {
  Access best = Access::kNone;
  for (const std::string& value : CookieValues(req)) {
    for (Access a : {Access::kAdmin, Access::kViewer}) {
      if (a > best && auth::ConstantTimeEquals(value, SessionValue(a, secret))) best = a;
    }
  }
  return best;
}

/// Who sends `req`, and whether by a bearer credential (not a cookie a browser adds by itself).
std::pair<Access, bool> RequestAccess(const httplib::Request& req, std::string_view secret) {
  const std::string authorization = req.get_header_value("Authorization");
  constexpr size_t kBearer = 7;  // "Bearer ", in any case (RFC 7235: the scheme is case-insensitive)
  if (authorization.size() > kBearer && strncasecmp(authorization.c_str(), "bearer ", kBearer) == 0) {
    return {AccessOf(std::string_view(authorization).substr(kBearer), secret), true};
  }
  return {CookieAccess(req, secret), false};
}

/// Secure when the browser reached us through a TLS proxy that says so.
std::string SessionCookie(Access access, std::string_view secret, const httplib::Request& req) {
  const bool tls = req.get_header_value("X-Forwarded-Proto") == "https";
  return std::string(kCookieName) + "=" + SessionValue(access, secret) + "; Path=/; HttpOnly; SameSite=Strict" +
         (tls ? "; Secure" : "");
}

}  // namespace

std::string ViewerToken(std::string_view secret) { return auth::Mac(secret, "copse-http-viewer"); }
std::string AdminToken(std::string_view secret) { return auth::Mac(secret, "copse-http-admin"); }

Access AccessOf(std::string_view credential, std::string_view secret) {
  if (secret.empty()) return Access::kNone;
  // Each compared in full, whatever the first said.
  const bool admin = auth::ConstantTimeEquals(credential, secret) | auth::ConstantTimeEquals(credential, AdminToken(secret));
  if (admin) return Access::kAdmin;
  return auth::ConstantTimeEquals(credential, ViewerToken(secret)) ? Access::kViewer : Access::kNone;
}

std::string Request::Param(const std::string& key, const std::string& fallback) const {
  auto it = params.find(key);
  return it == params.end() ? fallback : it->second;
}

Response Response::Json(int status, std::string body) {
  Response r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

Response Response::Error(int status, const std::string& message) {
  return Json(status, DumpJson(copse::Json{{"error", message}}));
}

class HttpServer::Impl {
 public:
  Impl(HttpServer& owner, std::string secret) : owner_(owner), secret_(std::move(secret)) {
    server_.new_task_queue = [] { return new httplib::ThreadPool(kWorkerThreads); };
    server_.set_keep_alive_timeout(2);  // an idle browser connection holds a worker thread
    server_.set_payload_max_length(1 << 20);
    server_.set_read_timeout(10, 0);
    server_.set_write_timeout(10, 0);
    // Logging in: the credential as a form field or JSON {"token"}; the cookie it sets.
    server_.Post("/api/v1/login", [this](const httplib::Request& req, httplib::Response& res) {
      std::string token = req.has_param("token") ? req.get_param_value("token") : "";
      if (token.empty()) {
        if (auto body = ParseJson(req.body, "login"); body.ok() && body->is_object()) token = body->value("token", "");
      }
      Login(token, req, res);
    });
    server_.Post("/api/v1/logout", [](const httplib::Request&, httplib::Response& res) {
      res.set_header("Set-Cookie", std::string(kCookieName) + "=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict");
      res.set_content("{}", kJsonType);
    });
    server_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      res.status = 500;
      res.set_content(DumpJson(copse::Json{{"error", what}}), kJsonType);
    });
  }

  void Route(bool post, const std::string& pattern, Access needed, Handler handler) {
    auto serve = [this, post, needed, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
      Request r;
      r.method = req.method;
      r.path = req.path;
      for (const auto& m : req.matches) r.matches.push_back(m.str());
      r.params.insert(req.params.begin(), req.params.end());
      r.body = req.body;
      const auto [access, bearer] = RequestAccess(req, secret_);
      r.access = access;
      res.set_header("Cache-Control", "no-store");
      if (post && !bearer && r.access != Access::kNone && req.get_header_value("X-Copse-Request") != "1") {
        Write(Response::Error(403, "a request that acts, sent with a session cookie, must carry X-Copse-Request: 1"), res);
        return;
      }
      if (r.access < needed) {
        const bool anyone = r.access == Access::kNone;
        Write(Response::Error(anyone ? 401 : 403, anyone ? "log in: present the cluster's secret or its viewer token "
                                                           "(Authorization: Bearer …, or POST /api/v1/login)"
                                                         : "this needs the cluster's secret (the viewer token only reads)"),
              res);
        return;
      }
      Response answer;
      try {
        answer = handler(r);
      } catch (const std::exception& e) {
        answer = Response::Error(500, e.what());
      }
      Write(std::move(answer), res);
    };
    if (post) {
      server_.Post(pattern, std::move(serve));
    } else {
      server_.Get(pattern, std::move(serve));
    }
  }

  void Write(Response r, httplib::Response& res) {
    res.status = r.status;
    for (auto& [k, v] : r.headers) res.set_header(k, v);
    if (!r.stream) {
      res.set_content(std::move(r.body), r.content_type);
      return;
    }
    if (streams_.fetch_add(1) >= kMaxStreams) {
      streams_.fetch_sub(1);
      res.status = 503;
      res.set_content(DumpJson(copse::Json{{"error", "too many open streams; try again later"}}), kJsonType);
      return;
    }
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        r.content_type,
        [this, stream = std::move(r.stream)](size_t, httplib::DataSink& sink) {
          try {  // outside httplib's exception handler: an escape would end the process
            stream([&](std::string_view chunk) {
              return !owner_.stopping() && sink.is_writable() && sink.write(chunk.data(), chunk.size());
            });
          } catch (const std::exception&) {
            return false;  // the connection is closed
          }
          sink.done();
          return true;
        },
        [this](bool) { streams_.fetch_sub(1); });
  }

  void Login(const std::string& token, const httplib::Request& req, httplib::Response& res) {
    const Access access = AccessOf(token, secret_);
    if (access == Access::kNone) {
      res.status = 401;
      res.set_content(
          DumpJson(copse::Json{{"error", "wrong token: give the cluster's secret, or a token `copse dashboard` printed"}}),
          kJsonType);
      return;
    }
    res.set_header("Set-Cookie", SessionCookie(access, secret_, req));
    res.set_content(DumpJson(copse::Json{{"access", access == Access::kAdmin ? "admin" : "viewer"}}), kJsonType);
  }

  Status Listen(const std::string& host, uint16_t port, const std::string& what, uint16_t* bound) {
    const int p = port == 0 ? server_.bind_to_any_port(host) : (server_.bind_to_port(host, port) ? port : -1);
    if (p <= 0) return Status::Unavailable(what + ": cannot listen on " + host + ":" + std::to_string(port));
    *bound = static_cast<uint16_t>(p);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // Until it runs, httplib's stop() does nothing: a Stop() before then would wait for ever.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!server_.is_running() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return Status::OK();
  }

  void Stop() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

 private:
  HttpServer& owner_;
  std::string secret_;
  httplib::Server server_;
  std::thread thread_;
  std::atomic<int> streams_{0};
};

HttpServer::HttpServer(std::string secret) : impl_(std::make_unique<Impl>(*this, std::move(secret))) {}
HttpServer::~HttpServer() { Stop(); }

void HttpServer::Get(const std::string& pattern, Access needed, Handler handler) {
  impl_->Route(false, pattern, needed, std::move(handler));
}
void HttpServer::Post(const std::string& pattern, Access needed, Handler handler) {
  impl_->Route(true, pattern, needed, std::move(handler));
}

Status HttpServer::Listen(const std::string& host, uint16_t port, const std::string& what) {
  return impl_->Listen(host, port, what, &port_);
}

void HttpServer::Stop() {
  stopping_ = true;
  impl_->Stop();
}

}  // namespace copse::http
