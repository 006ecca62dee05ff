// The benchmark's client against a scripted HTTP server on loopback whose streams have known
// timings and known faults (an error status, a stream cut in the middle, silence), so that what
// the client measures and counts can be checked against what was done.
#include "loadgen/runner.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "loadgen/arrivals.h"
#include "util/error.h"

namespace promptly::loadgen {
namespace {

using namespace std::chrono_literals;

// A listening loopback socket on a free port.
int listen_on_free_port(int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 64) != 0) return -1;
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port = ntohs(addr.sin_port);
  return fd;
}

void send_all(int fd, const std::string& s) {
  for (std::size_t at = 0; at < s.size();) {
    const ssize_t n = ::send(fd, s.data() + at, s.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return;
    at += static_cast<std::size_t>(n);
  }
}

std::string chunk(const std::string& payload) {
  const std::string event = "data: " + payload + "\n\n";
  char size[16];
  std::snprintf(size, sizeof size, "%zx\r\n", event.size());
  return size + event + "\r\n";
}

// Answers each connection by the word its request's last user message holds:
//   ok      200, chunked SSE: the first text after 40 ms, then two more 60 ms apart, usage (7 in, 3 out), [DONE]
//   error   500 with an OpenAI error body
//   cut     200, one chunk of text, then the connection closes without the chunked terminator
//   silent  reads the request and never answers
class ScriptedServer {
 public:
  ScriptedServer() {
    fd_ = listen_on_free_port(port_);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~ScriptedServer() {
    stopping_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    acceptor_.join();
    for (auto& t : handlers_) t.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<nlohmann::json> bodies() {
    std::lock_guard lock(mutex_);
    return bodies_;
  }

 private:
  void accept_loop() {
    for (;;) {
      const int client = ::accept(fd_, nullptr, nullptr);
      if (client < 0) return;
      if (stopping_) {
        ::close(client);
        return;
      }
      std::lock_guard lock(mutex_);
      handlers_.emplace_back([this, client] { handle(client); });
    }
  }

  void handle(int fd) {
    std::string request;
    char buf[4096];
    std::size_t header_end = std::string::npos, length = 0;
    while (header_end == std::string::npos || request.size() < header_end + 4 + length) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      request.append(buf, static_cast<std::size_t>(n));
      if (header_end == std::string::npos && (header_end = request.find("\r\n\r\n")) != std::string::npos) {
        const std::size_t at = request.find("Content-Length: ");
        if (at != std::string::npos) length = std::stoul(request.substr(at + 16));
      }
    }
    const nlohmann::json body = nlohmann::json::parse(request.substr(header_end + 4), nullptr, false);
    {
      std::lock_guard lock(mutex_);
      bodies_.push_back(body);
    }
    const std::string word = body.is_object() ? body["messages"].back()["content"].get<std::string>() : "";
    const std::string ok_head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    if (word == "error") {
      const std::string error = R"({"error":{"message":"model exploded","type":"server_error"}})";
      send_all(fd, "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(error.size()) +
                       "\r\nConnection: close\r\n\r\n" + error);
    } else if (word == "cut") {
      send_all(fd, ok_head + chunk(R"({"choices":[{"index":0,"delta":{"content":"half"}}]})"));
    } else if (word == "silent") {
      std::this_thread::sleep_for(600ms);
    } else {
      send_all(fd, ok_head + chunk(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})"));
      std::this_thread::sleep_for(40ms);
      for (const char* piece : {"Hello", " there", " friend"}) {
        if (std::string(piece) != "Hello") std::this_thread::sleep_for(60ms);
        send_all(fd, chunk(nlohmann::json{{"choices", {{{"index", 0}, {"delta", {{"content", piece}}}}}}}.dump()));
      }
      send_all(fd, chunk(R"({"choices":[{"index":0,"delta":{},"finish_reason":"length"}]})") +
                       chunk(R"({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}})") + chunk("[DONE]") + "0\r\n\r\n");
    }
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
  }

  int fd_ = -1, port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mutex_;
  std::vector<std::thread> handlers_;
  std::vector<nlohmann::json> bodies_;
};

Session turns(std::vector<std::string> words) {
  Session s;
  for (auto& w : words) s.turns.push_back({std::move(w), 3});
  return s;
}

RunResult run(const std::string& url, const std::vector<Session>& sessions, double timeout_s, std::size_t& progress_calls) {
  boost::asio::io_context io;
  HttpClient client(io, parse_url(url), "", timeout_s);
  RunConfig config;
  config.request_rate = kInfiniteRate;
  config.think_ms = 10;
  std::function<void(std::size_t, std::size_t, std::size_t)> progress = [&](std::size_t done, std::size_t, std::size_t total) {
    ++progress_calls;
    EXPECT_LE(done, total);
  };
  return run_benchmark(io, client, sessions, config, progress);
}

TEST(Runner, MeasuresKnownTimingsAndCountsEveryFault) {
  ScriptedServer server;
  const std::vector<Session> sessions = {turns({"ok"}), turns({"error", "ok"}), turns({"cut"}), turns({"ok", "ok"})};
  std::size_t progress_calls = 0;
  const RunResult result = run(server.url(), sessions, 5, progress_calls);
  ASSERT_EQ(result.records.size(), 6u);
  EXPECT_EQ(progress_calls, 6u);

  std::map<std::string, int> errors;
  std::vector<double> gaps_ms, tpots_ms;
  for (const auto& r : result.records) {
    if (!r.success) {
      ++errors[r.error];
      continue;
    }
    EXPECT_EQ(r.generated_text, "Hello there friend");
    EXPECT_EQ(r.prompt_tokens, 7u);
    EXPECT_EQ(r.output_tokens, 3u);
    // The server sent the texts 40, 100 and 160 ms after the request: a busy machine can only
    // delay when each arrives. A single gap has no lower bound (a text read late shortens the
    // gap after it), so the arrivals are checked from the send.
    ASSERT_EQ(r.itl_s.size(), 2u);
    EXPECT_GE(r.ttft_s, 0.039);
    EXPECT_GE(r.ttft_s + r.itl_s[0], 0.099);
    EXPECT_GE(r.ttft_s + r.itl_s[0] + r.itl_s[1], 0.159);
    EXPECT_LT(r.ttft_s, 0.040 + 0.5);
    for (double gap : r.itl_s) {
      EXPECT_GT(gap, 0.0);
      EXPECT_LT(gap, 0.060 + 0.5);
      gaps_ms.push_back(gap * 1000);
    }
    EXPECT_GE(r.e2el_s, r.ttft_s + r.itl_s[0] + r.itl_s[1]);
    tpots_ms.push_back((r.e2el_s - r.ttft_s) / 2 * 1000);
  }
  EXPECT_EQ(errors["HTTP 500: model exploded"], 1);
  EXPECT_EQ(errors["not sent: an earlier turn of its conversation failed"], 1);
  ASSERT_EQ(errors.size(), 3u) << "errors: " << nlohmann::json(errors).dump();
  std::size_t cut = 0;
  for (const auto& [error, n] : errors) cut += error.find("cut before its end") != std::string::npos ? static_cast<std::size_t>(n) : 0;
  EXPECT_EQ(cut, 1u);

  const Summary s = summarize(result.records, result.duration_s, Slo{});
  EXPECT_EQ(s.completed, 3u);
  EXPECT_EQ(s.failed, 3u);
  EXPECT_EQ(s.total_output_tokens, 9u);
  ASSERT_EQ(gaps_ms.size(), 6u);
  std::sort(gaps_ms.begin(), gaps_ms.end());
  EXPECT_NEAR(s.itl.median_ms, (gaps_ms[2] + gaps_ms[3]) / 2, 1e-9);
  EXPECT_NEAR(s.tpot.mean_ms, (tpots_ms[0] + tpots_ms[1] + tpots_ms[2]) / 3, 1e-9);  // (E2EL - TTFT) / (tokens - 1)

  // The follow-up turn carried the server's own first answer back as history.
  bool saw_history = false;
  for (const nlohmann::json& body : server.bodies()) {
    EXPECT_EQ(body["stream"], true);
    EXPECT_EQ(body["stream_options"]["include_usage"], true);
    EXPECT_EQ(body["max_tokens"], 3);
    const auto& messages = body["messages"];
    if (messages.size() == 3) {
      EXPECT_EQ(messages[1]["role"], "assistant");
      EXPECT_EQ(messages[1]["content"], "Hello there friend");
      saw_history = true;
    }
  }
  EXPECT_TRUE(saw_history);
}

TEST(Runner, ASilentServerTimesOutInsteadOfHanging) {
  ScriptedServer server;
  std::size_t progress_calls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult result = run(server.url(), {turns({"silent"})}, 0.2, progress_calls);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  ASSERT_EQ(result.records.size(), 1u);
  EXPECT_FALSE(result.records[0].success);
  EXPECT_NE(result.records[0].error.find("sent nothing for 0.2 s"), std::string::npos) << result.records[0].error;
}

TEST(Runner, RefusedConnectionsAreCountedNotFatal) {
  int port = 0;
  const int fd = listen_on_free_port(port);
  ::close(fd);  // nothing listens there now
  std::size_t progress_calls = 0;
  const RunResult result = run("http://127.0.0.1:" + std::to_string(port), {turns({"a", "b"}), turns({"c"}), turns({"d"})}, 5, progress_calls);
  ASSERT_EQ(result.records.size(), 4u);
  std::size_t refused = 0;
  for (const auto& r : result.records) {
    EXPECT_FALSE(r.success);
    refused += r.error.find("connect:") == 0;
  }
  EXPECT_EQ(refused, 3u);  // the fourth is the second turn, never sent
}

TEST(Runner, UnresolvableHostFailsEachRequestWithTheReason) {
  std::size_t progress_calls = 0;
  const RunResult result = run("http://no-such-host.invalid:8080", {turns({"a"}), turns({"b"})}, 5, progress_calls);
  ASSERT_EQ(result.records.size(), 2u);
  for (const auto& r : result.records) EXPECT_NE(r.error.find("resolving no-such-host.invalid"), std::string::npos) << r.error;
}

TEST(RequestBody, ChatResendsTheHistoryWithTheServersAnswers) {
  Session s;
  s.system = "sys";
  s.turns = {{"q1", 5}, {"q2", 6}};
  RunConfig config;
  config.model = "m";
  const auto body = nlohmann::json::parse(request_body(config, s, {"a1"}, 1));
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["max_tokens"], 6);
  EXPECT_FALSE(body.contains("ignore_eos"));
  const nlohmann::json expected = nlohmann::json::parse(
      R"([{"role":"system","content":"sys"},{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2"}])");
  EXPECT_EQ(body["messages"], expected);
}

TEST(RequestBody, CompletionsJoinTheHistoryAsText) {
  Session s;
  s.turns = {{"q1", 5}, {"q2", 6}};
  RunConfig config;
  config.api = Api::Completions;
  config.ignore_eos = true;
  const auto body = nlohmann::json::parse(request_body(config, s, {"a1"}, 1));
  EXPECT_FALSE(body.contains("model"));
  EXPECT_EQ(body["prompt"], "q1\n\na1\n\nq2");
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_FALSE(body.contains("messages"));
}

TEST(ParseUrl, AcceptsRootsAndBaseUrlsRejectsTheRest) {
  const Endpoint e = parse_url("http://localhost:8000/v1/");
  EXPECT_EQ(e.host, "localhost");
  EXPECT_EQ(e.port, "8000");
  EXPECT_EQ(e.base_path, "");
  EXPECT_EQ(parse_url("http://example.com/proxy").base_path, "/proxy");
  EXPECT_EQ(parse_url("http://example.com").port, "80");
  EXPECT_EQ(parse_url("http://[::1]:9000").host, "::1");
  for (const char* bad : {"localhost:8080", "https://x", "http://", "http://h:99999", "http://h:port", "ftp://h"}) EXPECT_THROW(parse_url(bad), Error) << bad;
}

}  // namespace
}  // namespace promptly::loadgen
