#pragma once
// `promptly serve`: an OpenAI-compatible HTTP/1.1 server on Boost.Beast. A few I/O threads run
// every connection asynchronously (each on its own strand); generation runs on the engine's thread
// and its events are posted back to the connection's strand, so a token is written the moment it
// exists. A client that disconnects cancels its request in the engine at once.
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "chat/tool_calls.h"
#include "engine/engine.h"
#include "metrics/metrics.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace promptly::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  unsigned short port = 8080;  // 0: any free port (see Server::port)
  int io_threads = 2;
  std::size_t max_queue = 256;            // waiting requests beyond this get 429
  std::string api_key;                    // non-empty: /v1/* need "Authorization: Bearer KEY"
  std::string model_id;                   // the name clients use (--alias, else the file's stem)
  std::string chat_template;              // template source; empty: the model's, else ChatML
  std::size_t max_body_bytes = 8 << 20;
  double idle_timeout_s = 60;             // keep-alive connections and slow request bodies
  double shutdown_grace_s = 10;
  // On SIGINT/SIGTERM, /health answers 503 at once but new requests are still served for this long,
  // so that a load balancer checking /health stops sending them before they would be refused.
  double drain_delay_s = 0;
  bool webui = true;                      // the chat UI at / (--no-webui: 404 there)
  std::function<void()> on_shutdown;     // called once when shutdown begins (after any drain delay)
  // The PCI bus id of the GPU the model runs on (DeviceForward::pci_bus_id), if any: /metrics then
  // reports its utilisation and memory.
  std::optional<std::string> gpu;
};

// The `markers` (tool_call_control_markers) that `tokenizer` holds as control tokens, by id: the
// engine's text never shows control tokens, so the server writes these back into the text it parses
// for calls.
std::map<std::int32_t, std::string> tool_marker_tokens(const Tokenizer& tokenizer, const std::vector<std::string>& markers);

class Server {
 public:
  Server(const Model& model, const Tokenizer& tokenizer, Engine& engine, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds (throws Error when it cannot) and returns the bound port.
  unsigned short listen();
  // Serves until SIGINT/SIGTERM or stop(). A signal first drains: /health answers 503 while new
  // requests are still served for drain_delay_s. Then (and at once on stop()) new requests get 503,
  // in-flight ones finish for up to shutdown_grace_s, the rest are cancelled, and run() returns.
  void run();
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace promptly::server
