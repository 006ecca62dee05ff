#include "loadgen/client.h"

#include <boost/asio/connect.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "loadgen/sse.h"
#include "util/error.h"

namespace promptly::loadgen {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

Endpoint parse_url(const std::string& url) {
  constexpr std::string_view kScheme = "http://";
  if (url.starts_with("https://"))
    throw Error("--url " + url + ": https is not supported; point it at the server's plain HTTP port (or a local proxy)");
  if (!url.starts_with(kScheme)) throw Error("--url '" + url + "': expected http://HOST[:PORT][/PATH], e.g. http://127.0.0.1:8080");
  const std::string rest = url.substr(kScheme.size());
  const std::size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  Endpoint e;
  e.base_path = slash == std::string::npos ? "" : rest.substr(slash);
  while (e.base_path.ends_with('/')) e.base_path.pop_back();
  if (e.base_path.ends_with("/v1")) e.base_path.resize(e.base_path.size() - 3);
  std::string host = authority, port = "80";
  if (authority.starts_with('[')) {  // [IPv6]:port
    const std::size_t close = authority.find(']');
    if (close == std::string::npos) throw Error("--url '" + url + "': unterminated [IPv6 address]");
    host = authority.substr(1, close - 1);
    if (close + 1 < authority.size() && authority[close + 1] == ':') port = authority.substr(close + 2);
  } else if (const std::size_t colon = authority.rfind(':'); colon != std::string::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (host.empty()) throw Error("--url '" + url + "': no host (expected http://HOST[:PORT])");
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 || std::stoul(port) > 65535)
    throw Error("--url '" + url + "': port '" + port + "' is not a number from 0 to 65535");
  e.host = host;
  e.port = port;
  return e;
}

namespace {

// The message of an error answer: OpenAI's error.message, else the start of the body.
std::string error_message(int status, const std::string& body) {
  std::string message = body.substr(0, 300);
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error")) {
    const auto& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) message = e["message"].get<std::string>();
    else if (e.is_string()) message = e.get<std::string>();
  }
  return "HTTP " + std::to_string(status) + (message.empty() ? "" : ": " + message);
}

// One streamed request from connect to the end of the response; it keeps itself alive through the
// handlers it has pending.
class StreamingRequest : public std::enable_shared_from_this<StreamingRequest> {
 public:
  StreamingRequest(asio::io_context& io, http::request<http::string_body> request, std::chrono::milliseconds timeout,
                   std::function<void(std::string_view)> on_event, std::function<void(const StreamEnd&)> on_end)
      : stream_(io), request_(std::move(request)), timeout_(timeout), on_event_(std::move(on_event)), on_end_(std::move(on_end)) {
    // A stream is as long as the answer: Beast's default cap (8 MB) would cut long generations.
    parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
  }

  void start(const tcp::resolver::results_type& addresses) {
    stream_.expires_after(timeout_);
    stream_.async_connect(addresses, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
      if (ec) return self->end("connect: " + self->describe(ec));
      beast::error_code ignored;
      self->stream_.socket().set_option(tcp::no_delay(true), ignored);
      self->stream_.expires_after(self->timeout_);
      http::async_write(self->stream_, self->request_, [self](beast::error_code ec, std::size_t) {
        if (ec) return self->end("sending the request: " + self->describe(ec));
        self->stream_.expires_after(self->timeout_);
        http::async_read_header(self->stream_, self->buffer_, self->parser_, [self](beast::error_code ec, std::size_t) {
          if (ec) return self->end("reading the response header: " + self->describe(ec));
          self->status_ = static_cast<int>(self->parser_.get().result_int());
          self->read_body();
        });
      });
    });
  }

 private:
  void read_body() {
    if (parser_.is_done()) return finish();
    parser_.get().body().data = chunk_;
    parser_.get().body().size = sizeof chunk_;
    stream_.expires_after(timeout_);
    http::async_read_some(stream_, buffer_, parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      const std::size_t got = sizeof self->chunk_ - self->parser_.get().body().size;
      if (got > 0) self->consume(std::string_view(self->chunk_, got));
      if (ec == http::error::need_buffer) ec = {};
      if (ec) return self->end("reading the stream: " + self->describe(ec) + " (the stream was cut before its end)");
      self->read_body();
    });
  }

  void consume(std::string_view bytes) {
    if (status_ != 200) {
      // An error answer is read whole for its message, but never without bound.
      if (error_body_.size() < 64 * 1024) error_body_.append(bytes.substr(0, 64 * 1024 - error_body_.size()));
      return;
    }
    for (const std::string& data : sse_.feed(bytes)) on_event_(data);
  }

  void finish() {
    if (status_ != 200) return end(error_message(status_, error_body_));
    end("");
  }

  std::string describe(beast::error_code ec) const {
    if (ec == beast::error::timeout) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g", static_cast<double>(timeout_.count()) / 1000);
      return std::string("the server sent nothing for ") + seconds + " s (--timeout)";
    }
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == http::error::partial_message) return "the server closed the connection";
    return ec.message();
  }

  void end(std::string error) {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    if (on_end_) {
      auto on_end = std::move(on_end_);
      on_end_ = nullptr;
      on_end(StreamEnd{std::move(error), status_});
    }
  }

  beast::tcp_stream stream_;
  http::request<http::string_body> request_;
  std::chrono::milliseconds timeout_;
  std::function<void(std::string_view)> on_event_;
  std::function<void(const StreamEnd&)> on_end_;
  beast::flat_buffer buffer_;
  http::response_parser<http::buffer_body> parser_;
  char chunk_[16 * 1024];
  int status_ = 0;
  std::string error_body_;
  SseParser sse_;
};

}  // namespace

HttpClient::HttpClient(asio::io_context& io, Endpoint endpoint, std::string api_key, double timeout_s)
    : io_(io), endpoint_(std::move(endpoint)), api_key_(std::move(api_key)), timeout_s_(timeout_s) {
  tcp::resolver resolver(io_);
  beast::error_code ec;
  addresses_ = resolver.resolve(endpoint_.host, endpoint_.port, ec);
  if (ec) resolve_error_ = "resolving " + endpoint_.host + ": " + ec.message();
}

void HttpClient::post_stream(const std::string& path, std::string body, std::function<void(std::string_view)> on_event,
                             std::function<void(const StreamEnd&)> on_end) {
  if (!resolve_error_.empty()) {
    // Reported from the loop, like any other failure, so that callers see one order of events.
    asio::post(io_, [on_end = std::move(on_end), error = resolve_error_] { on_end(StreamEnd{error, 0}); });
    return;
  }
  http::request<http::string_body> request{http::verb::post, endpoint_.base_path + path, 11};
  request.set(http::field::host, endpoint_.host);
  request.set(http::field::content_type, "application/json");
  request.set(http::field::accept, "text/event-stream");
  request.set(http::field::user_agent, "promptly-bench-serve");
  if (!api_key_.empty()) request.set(http::field::authorization, "Bearer " + api_key_);
  request.keep_alive(false);
  request.body() = std::move(body);
  request.prepare_payload();
  const auto timeout = std::chrono::milliseconds(static_cast<long long>(timeout_s_ * 1000));
  std::make_shared<StreamingRequest>(io_, std::move(request), timeout, std::move(on_event), std::move(on_end))->start(addresses_);
}

std::optional<std::string> HttpClient::get(const std::string& path, std::string& error) {
  if (!resolve_error_.empty()) {
    error = resolve_error_;
    return std::nullopt;
  }
  // Asynchronous calls run to completion here, because only they honour the stream's timeout: a
  // server that accepts and never answers must not hang the benchmark before it starts.
  beast::tcp_stream stream(io_);
  beast::flat_buffer buffer;
  http::request<http::empty_body> request{http::verb::get, endpoint_.base_path + path, 11};
  request.set(http::field::host, endpoint_.host);
  if (!api_key_.empty()) request.set(http::field::authorization, "Bearer " + api_key_);
  request.keep_alive(false);
  http::response_parser<http::string_body> parser;
  parser.body_limit(1 << 20);
  const auto timeout = std::chrono::milliseconds(static_cast<long long>(timeout_s_ * 1000));
  stream.expires_after(timeout);
  stream.async_connect(addresses_, [&](beast::error_code ec, const tcp::endpoint&) {
    if (ec) {
      error = "connect: " + ec.message();
      return;
    }
    http::async_write(stream, request, [&](beast::error_code ec, std::size_t) {
      if (ec) {
        error = "GET " + path + ": " + ec.message();
        return;
      }
      http::async_read(stream, buffer, parser, [&](beast::error_code ec, std::size_t) {
        if (ec) error = "GET " + path + ": " + (ec == beast::error::timeout ? "no answer in time" : ec.message());
      });
    });
  });
  io_.restart();
  io_.run();
  io_.restart();
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  if (!error.empty()) return std::nullopt;
  const auto& response = parser.get();
  if (response.result_int() != 200) {
    error = error_message(static_cast<int>(response.result_int()), response.body());
    return std::nullopt;
  }
  return response.body();
}

}  // namespace promptly::loadgen
