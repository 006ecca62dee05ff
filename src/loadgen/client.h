#pragma once
// The benchmark's HTTP/1.1 client: streamed POSTs over Boost.Beast, any number in flight on the
// one thread that runs the io_context, so the client's own scheduling does not disturb the timings
// it takes. Only plain HTTP: put a TLS-terminating proxy in front for https servers.
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace promptly::loadgen {

struct Endpoint {
  std::string host;
  std::string port;
  std::string base_path;  // what comes before /v1/... ("" or e.g. "/proxy")
};

// "http://host[:port][/base]" -> its parts (port 80 when none, a trailing "/v1" dropped so that
// both the server's root and its OpenAI base URL work). Throws Error for other schemes or no host.
Endpoint parse_url(const std::string& url);

// How a streamed request ends: `error` empty when the whole HTTP message arrived with status 200.
struct StreamEnd {
  std::string error;
  int status = 0;  // HTTP status, 0 when no response came
};

class HttpClient {
 public:
  // Resolves the host once; a failure there is kept and reported by every request.
  HttpClient(boost::asio::io_context& io, Endpoint endpoint, std::string api_key, double timeout_s);

  // Sends `body` as JSON to `path` and calls `on_event` with each server-sent event's data as it
  // arrives, then `on_end` once. A non-200 answer's error message (OpenAI's error.message when
  // the body has one) is the end's error. `timeout_s` bounds every wait for the server.
  void post_stream(const std::string& path, std::string body, std::function<void(std::string_view)> on_event,
                   std::function<void(const StreamEnd&)> on_end);

  // A GET that runs the io_context until it is answered, so call it only while no run is under
  // way (the benchmark asks for /v1/models first): the body, or nullopt with `error` set.
  std::optional<std::string> get(const std::string& path, std::string& error);

  const Endpoint& endpoint() const { return endpoint_; }

 private:
  boost::asio::io_context& io_;
  Endpoint endpoint_;
  std::string api_key_;
  double timeout_s_;
  boost::asio::ip::tcp::resolver::results_type addresses_;
  std::string resolve_error_;
};

}  // namespace promptly::loadgen
