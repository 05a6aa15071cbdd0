#include "common/http_server.h"

#include <thread>

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

std::string CookieCredential(const httplib::Request& req) {
  const std::string cookies = req.get_header_value("Cookie");
  size_t at = 0;
  while (at < cookies.size()) {
    size_t end = cookies.find(';', at);
    if (end == std::string::npos) end = cookies.size();
    std::string_view part(cookies.data() + at, end - at);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    if (part.substr(0, kCookieName.size()) == kCookieName && part.size() > kCookieName.size() &&
        part[kCookieName.size()] == '=') {
      return std::string(part.substr(kCookieName.size() + 1));
    }
    at = end + 1;
  }
  return "";
}

Access RequestAccess(const httplib::Request& req, std::string_view secret) {
  const std::string authorization = req.get_header_value("Authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.compare(0, kBearer.size(), kBearer) == 0) return AccessOf(authorization.substr(kBearer.size()), secret);
  const std::string cookie = CookieCredential(req);
  if (cookie.empty()) return Access::kNone;
  for (Access a : {Access::kAdmin, Access::kViewer}) {
    if (auth::ConstantTimeEquals(cookie, SessionValue(a, secret))) return a;
  }
  return Access::kNone;
}

std::string SessionCookie(Access access, std::string_view secret) {
  return std::string(kCookieName) + "=" + SessionValue(access, secret) + "; Path=/; HttpOnly; SameSite=Strict";
}

}  // namespace

std::string ViewerToken(std::string_view secret) { return auth::Mac(secret, "copse-http-viewer"); }

Access AccessOf(std::string_view credential, std::string_view secret) {
  if (!secret.empty() && auth::ConstantTimeEquals(credential, secret)) return Access::kAdmin;
  if (!secret.empty() && auth::ConstantTimeEquals(credential, ViewerToken(secret))) return Access::kViewer;
  return Access::kNone;
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
      Login(token, res, /*redirect=*/false);
    });
    server_.Get("/login", [this](const httplib::Request& req, httplib::Response& res) {
      Login(req.has_param("token") ? req.get_param_value("token") : "", res, /*redirect=*/true);
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
    auto serve = [this, needed, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
      Request r;
      r.method = req.method;
      r.path = req.path;
      for (const auto& m : req.matches) r.matches.push_back(m.str());
      r.params.insert(req.params.begin(), req.params.end());
      r.body = req.body;
      r.access = RequestAccess(req, secret_);
      res.set_header("Cache-Control", "no-store");
      if (r.access < needed) {
        const bool anyone = r.access == Access::kNone;
        Write(Response::Error(anyone ? 401 : 403, anyone ? "log in: present the cluster's secret or its viewer token "
                                                           "(Authorization: Bearer …, or POST /api/v1/login)"
                                                         : "this needs the cluster's secret (the viewer token only reads)"),
              res);
        return;
      }
      Write(handler(r), res);
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
          stream([&](std::string_view chunk) {
            return !owner_.stopping() && sink.is_writable() && sink.write(chunk.data(), chunk.size());
          });
          sink.done();
          return true;
        },
        [this](bool) { streams_.fetch_sub(1); });
  }

  void Login(const std::string& token, httplib::Response& res, bool redirect) {
    const Access access = AccessOf(token, secret_);
    if (access == Access::kNone) {
      res.status = 401;
      res.set_content(DumpJson(copse::Json{{"error", "wrong token: give the cluster's secret or its viewer token"}}), kJsonType);
      return;
    }
    res.set_header("Set-Cookie", SessionCookie(access, secret_));
    if (redirect) {
      res.set_redirect("/");
    } else {
      res.set_content(DumpJson(copse::Json{{"access", access == Access::kAdmin ? "admin" : "viewer"}}), kJsonType);
    }
  }

  Status Listen(const std::string& host, uint16_t port, const std::string& what, uint16_t* bound) {
    const int p = port == 0 ? server_.bind_to_any_port(host) : (server_.bind_to_port(host, port) ? port : -1);
    if (p <= 0) return Status::Unavailable(what + ": cannot listen on " + host + ":" + std::to_string(port));
    *bound = static_cast<uint16_t>(p);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
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
