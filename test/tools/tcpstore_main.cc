// phos-tcpstore: phos's TCPStore server and client (support/) from a shell,
// for the tests.
//
//   phos-tcpstore serve HOST:PORT [-- COMMAND...]   serve a store (PORT 0: one the
//       system picks, printed on the first line); with a
//       command, run it as a child and exit with its status (the stand-in
//       for torchrun's agent: the store's process is the root of the tree
//       its ranks descend from)
//   phos-tcpstore keys HOST:PORT                    how many keys it holds
//   phos-tcpstore get HOST:PORT KEY [MS]            a key's value (waiting MS, default 1000)
//   phos-tcpstore set HOST:PORT KEY VALUE
//   phos-tcpstore add HOST:PORT KEY N
//   phos-tcpstore exercise HOST:PORT                every query of the protocol, one line
//       each, against any TCPStore (torch's: test/gpu/tcpstore_interop.py)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "phos/support/socket_io.h"
#include "phos/support/tcp_store_client.h"
#include "phos/support/tcp_store_protocol.h"
#include "phos/support/tcp_store_server.h"

using namespace phos::net;
using namespace std::chrono_literals;

namespace {

constexpr const char* kUsage =
    "usage: phos-tcpstore serve HOST:PORT [-- COMMAND...]\n"
    "       phos-tcpstore keys HOST:PORT\n"
    "       phos-tcpstore get HOST:PORT KEY [MS]\n"
    "       phos-tcpstore set HOST:PORT KEY VALUE\n"
    "       phos-tcpstore add HOST:PORT KEY N\n"
    "       phos-tcpstore exercise HOST:PORT\n";

int fail(const std::string& what) {
  std::fprintf(stderr, "phos-tcpstore: %s\n", what.c_str());
  return 1;
}

int serve(const HostPort& at, char** command) {
  auto server = TcpStoreServer::start(at.host, at.port);
  if (!server) return fail(server.error().message);
  std::printf("serving a TCPStore on %s\n", HostPort{at.host, (*server)->port()}.text().c_str());
  std::fflush(stdout);
  if (!command || !*command) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, nullptr);
    int sig = 0;
    sigwait(&set, &sig);
    return 0;
  }
  pid_t child = fork();
  if (child < 0) return fail(std::string("fork: ") + std::strerror(errno));
  if (child == 0) {
    execvp(command[0], command);
    std::fprintf(stderr, "phos-tcpstore: cannot run %s: %s\n", command[0], std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Prints "QUERY result" per query; the first failure ends it (status 1).
int exercise(TcpStoreClient& c) {
  auto line = [](const char* q, const std::string& result) { std::printf("%-12s %s\n", q, result.c_str()); };
  auto error = [](const char* q, const phos::Error& e) { return fail(std::string(q) + ": " + e.message); };
  if (auto p = c.ping(0x1234); !p || *p != 0x1234) return p ? fail("PING: wrong echo") : error("PING", p.error());
  line("PING", "echoed");
  if (auto r = c.set("phos/interop/set", bytes_of("from phos")); !r) return error("SET", r.error());
  line("SET", "phos/interop/set");
  auto got = c.get("phos/interop/set", deadline_in(2s));
  if (!got) return error("GET", got.error());
  line("GET", text_of(*got));
  auto added = c.add("phos/interop/add", 5);
  if (!added) return error("ADD", added.error());
  added = c.add("phos/interop/add", -2);
  if (!added) return error("ADD", added.error());
  line("ADD", std::to_string(*added));
  auto as_text = c.get("phos/interop/add", deadline_in(2s));
  if (!as_text) return error("GET", as_text.error());
  line("ADD-TEXT", text_of(*as_text));
  auto ready = c.check({"phos/interop/set", "phos/interop/add"});
  if (!ready) return error("CHECK", ready.error());
  auto not_ready = c.check({"phos/interop/none"});
  if (!not_ready) return error("CHECK", not_ready.error());
  line("CHECK", std::string(*ready ? "ready" : "not-ready") + " " + (*not_ready ? "ready" : "not-ready"));
  auto waited = c.wait({"phos/interop/none"}, deadline_in(300ms));
  if (waited || waited.error().code != ETIMEDOUT) return fail("WAIT: no timeout for a missing key");
  line("WAIT", "timed-out, cancelled");
  if (auto w = c.wait({"phos/interop/set"}, deadline_in(2s)); !w) return error("WAIT", w.error());
  line("WAIT", "present");
  auto missing = c.compare_set("phos/interop/cas", bytes_of("x"), bytes_of("y"));
  if (!missing) return error("COMPARE_SET", missing.error());
  auto first = c.compare_set("phos/interop/cas", {}, bytes_of("a"));
  if (!first) return error("COMPARE_SET", first.error());
  auto second = c.compare_set("phos/interop/cas", {}, bytes_of("b"));
  if (!second) return error("COMPARE_SET", second.error());
  line("COMPARE_SET", text_of(*missing) + " " + text_of(*first) + " " + text_of(*second));
  auto keys = c.num_keys();
  if (!keys) return error("GETNUMKEYS", keys.error());
  line("GETNUMKEYS", std::to_string(*keys));
  auto deleted = c.remove("phos/interop/cas");
  if (!deleted) return error("DELETE_KEY", deleted.error());
  auto again = c.remove("phos/interop/cas");
  if (!again) return error("DELETE_KEY", again.error());
  line("DELETE_KEY", std::string(*deleted ? "1" : "0") + " " + (*again ? "1" : "0"));
  // A key torch set before (the interop test's), if any.
  if (auto t = c.check({"torch/interop"}); t && *t) {
    auto v = c.get("torch/interop", deadline_in(2s));
    if (!v) return error("GET", v.error());
    line("TORCH-KEY", text_of(*v));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return std::fputs(kUsage, stderr), 2;
  const std::string cmd = argv[1];
  auto at = parse_host_port(argv[2], /*any_port=*/cmd == "serve");
  if (!at) return fail(at.error().message);
  if (cmd == "serve") {
    if (argc > 3 && std::strcmp(argv[3], "--") != 0) return std::fputs(kUsage, stderr), 2;
    return serve(*at, argc > 4 ? argv + 4 : nullptr);
  }
  auto c = TcpStoreClient::connect(at->host, at->port, deadline_in(10s));
  if (!c) return fail(c.error().message);
  if (cmd == "keys" && argc == 3) {
    auto n = c->num_keys();
    if (!n) return fail(n.error().message);
    std::printf("%lld\n", (long long)*n);
    return 0;
  }
  if (cmd == "get" && (argc == 4 || argc == 5)) {
    auto v = c->get(argv[3], deadline_in(std::chrono::milliseconds(argc == 5 ? std::atoi(argv[4]) : 1000)));
    if (!v) return fail(v.error().message);
    std::printf("%s\n", text_of(*v).c_str());
    return 0;
  }
  if (cmd == "set" && argc == 5) {
    auto r = c->set(argv[3], bytes_of(argv[4]));
    return r ? 0 : fail(r.error().message);
  }
  if (cmd == "add" && argc == 5) {
    auto n = c->add(argv[3], std::atoll(argv[4]));
    if (!n) return fail(n.error().message);
    std::printf("%lld\n", (long long)*n);
    return 0;
  }
  if (cmd == "exercise" && argc == 3) return exercise(*c);
  return std::fputs(kUsage, stderr), 2;
}
