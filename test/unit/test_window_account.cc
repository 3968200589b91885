// What a copy window keeps of the program's calls for its close reply
// (phos/hooks/window_account.h), and how criu's log words it
// (phos/plugin/window_report.h, sum_check.h's refusal).
#include <catch2/catch.hpp>

#include "phos/hooks/window_account.h"
#include "phos/images/agent_protocol.h"
#include "phos/plugin/sum_check.h"
#include "phos/plugin/window_report.h"

using namespace phos;
using phos::hooks::WindowAccount;

namespace {
using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
constexpr uint64_t kChunk = 4u << 20;
// Two buffers of the program: A at 0x1000000 (64 MiB), B after it.
constexpr uint64_t kA = 0x1000000, kB = kA + (64u << 20);
const int kAdd = 0, kCat = 0, kScatter = 0;  // kernel identities
}  // namespace

TEST_CASE("window account: the launches that read a missed chunk's buffer without writing it are the suspects",
          "[window_account]") {
  WindowAccount w;
  // elementwise add reads A, writes B: its set held B, not A.
  for (int i = 0; i < 5; i++) w.launch(&kAdd, "add_kernel", Ranges{{kA, kB}}, Ranges{{kB, kB + (64u << 20)}});
  // cat writes A (saved before the launch): not a suspect for A.
  w.launch(&kCat, "cat_kernel", Ranges{{kA, kB}}, Ranges{{kA, kB}});
  // scatter only reads B.
  for (int i = 0; i < 2; i++) w.launch(&kScatter, "scatter_kernel", Ranges{{kB, kB + (64u << 20)}}, Ranges{});
  auto [suspects, count] = w.suspects({{.address = kA + 7 * kChunk, .bytes = kChunk}});
  REQUIRE(suspects.size() == 1);
  CHECK(count == 1);
  CHECK(suspects[0].name == "add_kernel");
  CHECK(suspects[0].launches == 5);
  // A chunk of B: scatter read it; add wrote it.
  auto inb = w.suspects({{.address = kB + kChunk, .bytes = kChunk}}).first;
  REQUIRE(inb.size() == 1);
  CHECK(inb[0].name == "scatter_kernel");
  // Outside both: none.
  CHECK(w.suspects({{.address = 0x10, .bytes = kChunk}}).first.empty());
  // Both chunks: most launched first.
  auto both = w.suspects({{.address = kA, .bytes = kChunk}, {.address = kB, .bytes = kChunk}}).first;
  REQUIRE(both.size() == 2);
  CHECK(both[0].name == "add_kernel");
  CHECK(both[1].name == "scatter_kernel");
  w.clear();
  CHECK(w.suspects({{.address = kA, .bytes = kChunk}}).first.empty());
}

TEST_CASE("window account: bounded: launch ranges past the limit are counted, not kept", "[window_account]") {
  WindowAccount w;
  for (uint64_t i = 0; i < WindowAccount::kMaxRanges + 10; i++)
    w.launch(&kAdd, "add_kernel", Ranges{{i * 4096, i * 4096 + 4096}}, Ranges{});
  CHECK(w.ranges_dropped() == 10);
  // A range kept before the limit still counts its launches.
  w.launch(&kAdd, "add_kernel", Ranges{{0, 4096}}, Ranges{});
  auto s = w.suspects({{.address = 0, .bytes = 4096}}).first;
  REQUIRE(s.size() == 1);
  CHECK(s[0].launches == 2);
}

TEST_CASE("window account: every launch counts its kernel; the buffers only where given (checksum)",
          "[window_account]") {
  WindowAccount w;
  // Speculated or validated trust: the kernel counted, no buffer kept.
  for (int i = 0; i < 3; i++) w.launch(&kAdd, "add_kernel", Ranges{}, Ranges{{kB, kB + (64u << 20)}});
  for (int i = 0; i < 7; i++) w.launch(&kCat, "cat_kernel", Ranges{}, Ranges{{kA, kB}});
  auto [kernels, count] = w.kernels();
  REQUIRE(kernels.size() == 2);
  CHECK(count == 2);
  CHECK(kernels[0].name == "cat_kernel");
  CHECK(kernels[0].launches == 7);
  CHECK(kernels[1].name == "add_kernel");
  CHECK(kernels[1].launches == 3);
  CHECK(w.suspects({{.address = kA, .bytes = kChunk}}).first.empty());
  // Checksum: the same kernel's launches keep what they read, and count once.
  w.launch(&kAdd, "add_kernel", Ranges{{kA, kB}}, Ranges{{kB, kB + (64u << 20)}});
  auto suspects = w.suspects({{.address = kA, .bytes = kChunk}}).first;
  REQUIRE(suspects.size() == 1);
  CHECK(suspects[0].launches == 1);
  CHECK(w.kernels().first[1].launches == 4);
}

TEST_CASE("window account: kernels and suspects alike are cut to the most launched, with the count of all",
          "[window_account]") {
  WindowAccount w;
  static const int ids[agent::kMaxWindowKernels + 4] = {};
  for (size_t k = 0; k < std::size(ids); k++)
    for (size_t i = 0; i <= k; i++) w.launch(&ids[k], "k" + std::to_string(k), Ranges{{kA, kB}}, Ranges{});
  for (const auto& [list, count] : {w.kernels(), w.suspects({{.address = kA, .bytes = kChunk}})}) {
    CHECK(count == std::size(ids));
    REQUIRE(list.size() == agent::kMaxWindowKernels);
    CHECK(list.front().name == "k" + std::to_string(std::size(ids) - 1));
    CHECK(list.front().launches == std::size(ids));
    CHECK(list.back().launches == std::size(ids) - agent::kMaxWindowKernels + 1);
  }
}

TEST_CASE("window account: the three longest waits are kept, longest first", "[window_account]") {
  WindowAccount w;
  for (uint64_t ms : {5, 1712, 40, 300, 2, 90})
    w.cost({.call = "kernel launch", .kernel = "k" + std::to_string(ms), .wait_ns = ms * 1000000,
            .chunks_waited = ms, .chunks_saved = 1});
  auto top = w.longest_waits();
  REQUIRE(top.size() == agent::kMaxLongestWaits);
  CHECK(top[0].kernel == "k1712");
  CHECK(top[1].kernel == "k300");
  CHECK(top[2].kernel == "k90");
  const std::string line = plugin::describe_longest_waits(top);
  INFO(line);
  CHECK(line.find("the calls that waited longest: kernel launch of k1712 1712.0 ms (1712 chunks waited for, 1 saved "
                  "into the pool); kernel launch of k300 300.0 ms") == 0);
  CHECK(plugin::describe_longest_waits({{.call = "cuMemsetD8_v2", .kernel = "", .wait_ns = 1500000, .chunks_waited = 3, .chunks_saved = 0}}) ==
        "the call that waited: cuMemsetD8_v2 1.5 ms (3 chunks waited for, 0 saved into the pool)");
  CHECK(plugin::describe_longest_waits({}) == "no call waited for the engine");
  // Where a call's time went, where the hooks said.
  CHECK(plugin::describe_longest_waits({{.call = "kernel launch",
                                         .kernel = "cat",
                                         .wait_ns = 521300000,
                                         .chunks_waited = 174,
                                         .chunks_saved = 13464,
                                         .save_ns = 140200000,
                                         .engine_wait_ns = 381100000}}) ==
        "the call that waited: kernel launch of cat 521.3 ms (174 chunks waited for, 13464 saved into the pool; "
        "saving 140.2 ms, waiting for the engine 381.1 ms)");
}

TEST_CASE("window account: the calls that saved the most into the pool are kept apart from the waits",
          "[window_account]") {
  WindowAccount w;
  // A large pool absorbs the writes: nothing waits, the saves tell which call writes.
  w.cost({.call = "cuMemcpyDtoDAsync_v2", .kernel = "", .wait_ns = 0, .chunks_waited = 0, .chunks_saved = 537});
  w.cost({.call = "kernel launch", .kernel = "cat", .wait_ns = 0, .chunks_waited = 0, .chunks_saved = 4});
  w.cost({.call = "kernel launch", .kernel = "add", .wait_ns = 0, .chunks_waited = 0, .chunks_saved = 12});
  w.cost({.call = "kernel launch", .kernel = "mul", .wait_ns = 0, .chunks_waited = 0, .chunks_saved = 2});
  CHECK(w.longest_waits().empty());
  auto top = w.most_saved();
  REQUIRE(top.size() == 3);
  CHECK(top[0].call == "cuMemcpyDtoDAsync_v2");
  CHECK(top[1].kernel == "add");
  CHECK(top[2].kernel == "cat");
  CHECK(plugin::describe_most_saved(top, 4u << 20).find(
            "the calls that saved the most into the pool: cuMemcpyDtoDAsync_v2 537 chunks (2148 MiB); kernel launch "
            "of add 12 chunks (48 MiB)") == 0);
  CHECK(plugin::describe_most_saved({}, 4u << 20) == "no call saved a chunk into the pool");
  // A call that waited for the whole window saved nothing: in the waits only.
  w.cost({.call = "cuGraphLaunch", .kernel = "", .wait_ns = 5, .chunks_waited = 0, .chunks_saved = 0});
  REQUIRE(w.longest_waits().size() == 1);
  CHECK(w.longest_waits()[0].call == "cuGraphLaunch");
  CHECK(w.most_saved().size() == 3);
}

TEST_CASE("window account: the refusal names the suspects before the kernels trusted", "[window_account][refusal]") {
  const std::string r = plugin::sum_check::refusal("chunk 3872 (...) differs from its content at the freeze",
                                                   {{"cat_kernel", 9}, {"add_kernel", 5}}, 2, {{"add_kernel", 5}});
  INFO(r);
  CHECK(r.find("; launches that pointed into the changed chunk's buffer without it in their speculated write set "
               "(the likely writers): add_kernel (5 launches); kernels trusted on speculation in the window: "
               "cat_kernel (9 launches)") != std::string::npos);
  CHECK(plugin::sum_check::describe_suspects({}).find("no launch on a trusted speculated set pointed into") == 0);
  // The engine's misses as the agent gets them.
  plugin::sum_check::Misses m;
  m.add({.chunk = 3872, .allocation_id = 198, .address = 0x7f0000000000, .offset = 8 * kChunk});
  auto ranges = plugin::sum_check::missed_ranges(m, kChunk);
  REQUIRE(ranges.size() == 1);
  CHECK(ranges[0].address == 0x7f0000000000 + 8 * kChunk);
  CHECK(ranges[0].bytes == kChunk);
}

TEST_CASE("window account: the close request and reply carry the misses, suspects and waits",
          "[window_account][agent_protocol]") {
  agent::CloseCopyWindowRequest q{.missed = true, .missed_chunks = {{.address = 0x1000, .bytes = kChunk}}};
  auto back = agent::decode_request(agent::encode_request(q));
  REQUIRE(back.ok());
  CHECK(std::get<agent::CloseCopyWindowRequest>(*back) == q);
  agent::CloseCopyWindowReply r;
  r.suspects = {{"add_kernel", 5}};
  r.longest_waits = {{.call = "kernel launch", .kernel = "k", .wait_ns = 9, .chunks_waited = 2, .chunks_saved = 1},
                     {.call = "cuMemcpyAsync", .kernel = "", .wait_ns = 3, .chunks_waited = 1, .chunks_saved = 0}};
  r.most_saved = {{.call = "cuMemsetD8_v2", .kernel = "", .wait_ns = 0, .chunks_waited = 0, .chunks_saved = 512}};
  auto rb = agent::decode_reply(agent::encode_reply(r));
  REQUIRE(rb.ok());
  CHECK(std::get<agent::CloseCopyWindowReply>(*rb) == r);
}
