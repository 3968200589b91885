// CUDA IPC served by phos: the handle's encoding (images/ipc_handle.h), the
// agent requests and fields that carry it, the manifest's IPC mappings, the
// dump's check of who shares what (plugin/ipc_sharing.h), and the hooks'
// set of interprocess events (hooks/interprocess_events.h).
#include <catch2/catch.hpp>
#include <cstring>
#include <set>

#include "fixtures.h"
#include "phos/hooks/interprocess_events.h"
#include "phos/images/agent_protocol.h"
#include "phos/images/format.h"
#include "phos/images/ipc_handle.h"
#include "phos/images/manifest.h"
#include "phos/plugin/ipc_sharing.h"

using namespace phos;

namespace {

agent::IpcHandle sample_handle() {
  return agent::IpcHandle{.pid = 4242, .nonce = 0x0123456789abcdefull, .allocation = 7, .offset = 0x1200,
                          .size = 300};
}

agent::Request round_trip(const agent::Request& r) {
  auto back = agent::decode_request(agent::encode_request(r));
  REQUIRE(back.ok());
  return *back;
}

agent::Reply round_trip(const agent::Reply& r) {
  auto back = agent::decode_reply(agent::encode_reply(r));
  REQUIRE(back.ok());
  return *back;
}

agent::Allocation imported(uint64_t id, uint64_t address, int32_t owner, uint64_t owner_allocation,
                           uint64_t size = 2 << 20) {
  return agent::Allocation{.id = id, .device = 0, .address = address, .size = size,
                           .flags = image::kAllocIpcImported,
                           .ipc = agent::IpcSource{.owner_pid = owner, .owner_allocation = owner_allocation,
                                                   .owner_agent = agent::agent_socket_name(owner, 1)}};
}

agent::Allocation owned(uint64_t id, uint64_t address, uint64_t size = 2 << 20) {
  return agent::Allocation{.id = id, .device = 0, .address = address, .size = size, .flags = 0};
}

}  // namespace

TEST_CASE("ipc handle: round trip in the 64 bytes of a CUipcMemHandle", "[ipc]") {
  const auto h = sample_handle();
  const auto bytes = agent::encode_ipc_handle(h);
  REQUIRE(bytes.size() == 64);
  CHECK(std::memcmp(bytes.data(), "PHOSIPC1", 8) == 0);
  auto back = agent::decode_ipc_handle(bytes.data());
  REQUIRE(back);
  CHECK(*back == h);
}

TEST_CASE("ipc handle: the driver's handles and damaged ones are not phos's", "[ipc]") {
  std::array<uint8_t, 64> zeros{};
  CHECK_FALSE(agent::decode_ipc_handle(zeros.data()));
  auto bytes = agent::encode_ipc_handle(sample_handle());
  for (size_t i : {8u, 16u, 24u, 47u, 48u, 63u}) {
    auto damaged = bytes;
    damaged[i] ^= 0x01;
    CHECK_FALSE(agent::decode_ipc_handle(damaged.data()));
  }
  // A handle of size 0, or one whose block wraps around, names nothing.
  auto empty = sample_handle();
  empty.size = 0;
  CHECK_FALSE(agent::decode_ipc_handle(agent::encode_ipc_handle(empty).data()));
  auto wraps = sample_handle();
  wraps.offset = ~0ull - 10;
  CHECK_FALSE(agent::decode_ipc_handle(agent::encode_ipc_handle(wraps).data()));
}

TEST_CASE("ipc handle: the agent's socket name and its nonce", "[ipc]") {
  const std::string name = agent::agent_socket_name(17, 0xfeedfacecafebeefull);
  CHECK(name == std::string(agent::kSocketPrefix) + "17.feedfacecafebeef");
  auto nonce = agent::agent_socket_nonce(name);
  REQUIRE(nonce);
  CHECK(*nonce == 0xfeedfacecafebeefull);
  CHECK_FALSE(agent::agent_socket_nonce(""));
  CHECK_FALSE(agent::agent_socket_nonce("other.17.feedfacecafebeef"));
  CHECK_FALSE(agent::agent_socket_nonce(std::string(agent::kSocketPrefix) + "17.feedface"));
  CHECK_FALSE(agent::agent_socket_nonce(std::string(agent::kSocketPrefix) + "17.FEEDFACECAFEBEEF"));
}

TEST_CASE("agent protocol: IPC requests, replies and fields round trip", "[ipc][agent]") {
  CHECK(round_trip(agent::IpcOpenRequest{.allocation = 9}) == agent::Request(agent::IpcOpenRequest{.allocation = 9}));
  CHECK(round_trip(agent::IpcCloseRequest{.allocation = 9}) == agent::Request(agent::IpcCloseRequest{.allocation = 9}));
  CHECK(std::get<agent::IpcOpenReply>(round_trip(agent::IpcOpenReply{.size = 1 << 21, .device = 1})) ==
        agent::IpcOpenReply{.size = 1 << 21, .device = 1});
  CHECK(std::holds_alternative<agent::IpcCloseReply>(round_trip(agent::IpcCloseReply{})));
  agent::StatusReply s;
  s.ipc_exports = {{.allocation = 3, .importer_pid = 12}, {.allocation = 3, .importer_pid = 0}};
  CHECK(std::get<agent::StatusReply>(round_trip(s)) == s);
  agent::ListAllocationsReply l{.allocations = {owned(1, 0x1000000), imported(2, 0x3000000, 55, 9)}, .total_count = 2};
  CHECK(std::get<agent::ListAllocationsReply>(round_trip(l)) == l);
  CHECK(agent::kind_name(agent::Request(agent::IpcOpenRequest{})) == "ipc_open");
}

TEST_CASE("manifest: IPC mappings round trip at format version 4", "[ipc][manifest]") {
  image::Manifest m = test::full_manifest();
  m.ipc_mappings = {imported(8, 0x7f1000000000ull, 1, 3)};
  m.format_version = image::format_version_for(m);
  CHECK(m.format_version == image::kIpcFormatVersion);
  auto back = image::decode_manifest(image::encode_manifest(m), "m.img");
  REQUIRE(back.ok());
  CHECK(back->ipc_mappings == m.ipc_mappings);
  CHECK(*back == m);
}

TEST_CASE("manifest: IPC mappings a reader must refuse", "[ipc][manifest]") {
  auto refused = [](image::Manifest m, const std::string& why) {
    auto back = image::decode_manifest(image::encode_manifest(m), "m.img");
    REQUIRE_FALSE(back.ok());
    CHECK_THAT(back.error().message, Catch::Contains(why));
  };
  image::Manifest m = test::full_manifest();
  m.ipc_mappings = {imported(8, 0x7f1000000000ull, 1, 3)};
  m.format_version = image::kKeptMemoryFormatVersion;
  refused(m, "has CUDA IPC mappings, which format version 3 does not have");
  m.format_version = image::kIpcFormatVersion;
  auto no_owner = m;
  no_owner.ipc_mappings[0].ipc.reset();
  refused(no_owner, "IPC mapping 8 names no owner process");
  auto same_id = m;
  same_id.ipc_mappings[0].id = 7;  // full_manifest's allocation
  refused(same_id, "IPC mapping 7 has the id of another allocation");
  auto overlaps = m;
  overlaps.ipc_mappings[0].address = 0x7f0000000000ull + 4096;
  refused(overlaps, "IPC mapping 8 overlaps another allocation");
}

TEST_CASE("ipc sharing: own allocations leave the IPC mappings out", "[ipc][plugin]") {
  std::vector<agent::Allocation> all = {owned(1, 0x1000000), imported(2, 0x3000000, 55, 9), owned(3, 0x5000000)};
  std::vector<UniqueFd> fds;
  for (int i = 0; i < 3; i++) fds.emplace_back(::dup(0));
  std::vector<agent::Allocation> own;
  std::vector<UniqueFd> own_fds;
  REQUIRE(plugin::own_allocations(all, fds, &own, &own_fds).ok());
  REQUIRE(own.size() == 2);
  CHECK(own[0].id == 1);
  CHECK(own[1].id == 3);
  CHECK(own_fds.size() == 2);
  auto mappings = plugin::ipc_mappings(all);
  REQUIRE(mappings.size() == 1);
  CHECK(mappings[0].id == 2);
  CHECK(plugin::shares_ipc(agent::StatusReply{}, all));
  CHECK_FALSE(plugin::shares_ipc(agent::StatusReply{}, own));
}

TEST_CASE("ipc sharing: the shared allocations are the owner's own that importers map", "[ipc][plugin][cow]") {
  agent::StatusReply status;
  // #1 open in two processes, #9 no longer the process's, #4 its mapping of
  // another's memory (never its to copy).
  status.ipc_exports = {{.allocation = 1, .importer_pid = 2},
                        {.allocation = 1, .importer_pid = 3},
                        {.allocation = 9, .importer_pid = 2},
                        {.allocation = 4, .importer_pid = 2}};
  std::vector<agent::Allocation> all = {owned(1, 0x1000000), owned(3, 0x3000000), imported(4, 0x5000000, 7, 1)};
  CHECK(plugin::shared_allocations(status, all) == std::set<uint64_t>{1});
  CHECK(plugin::shared_allocations(agent::StatusReply{}, all).empty());  // an importer only
  status.ipc_exports.push_back({.allocation = 3, .importer_pid = 0});   // one outside its pid namespace
  CHECK(plugin::shared_allocations(status, all) == std::set<uint64_t>{1, 3});
}

TEST_CASE("ipc sharing: who shares with whom must be in the dumped tree", "[ipc][plugin]") {
  agent::StatusReply owner_status, importer_status;
  owner_status.ipc_exports = {{.allocation = 1, .importer_pid = 2}};
  std::vector<agent::Allocation> owner_allocs = {owned(1, 0x1000000), owned(5, 0x2000000)};
  std::vector<agent::Allocation> importer_allocs = {owned(1, 0x1000000), imported(2, 0x3000000, 1, 1)};
  plugin::IpcParty owner{.pid = 100, .vpid = 1, .status = &owner_status, .allocations = &owner_allocs};
  plugin::IpcParty importer{.pid = 101, .vpid = 2, .status = &importer_status, .allocations = &importer_allocs};
  CHECK(plugin::check_ipc_tree({owner, importer}).ok());

  auto alone = plugin::check_ipc_tree({owner});
  REQUIRE_FALSE(alone.ok());
  CHECK_THAT(alone.error().message, Catch::Contains("process 100: its allocation #1 is open through CUDA IPC in "
                                                    "process 2 (pid in its namespace)"));
  auto orphan = plugin::check_ipc_tree({importer});
  REQUIRE_FALSE(orphan.ok());
  CHECK_THAT(orphan.error().message,
             Catch::Contains("process 101 maps allocation #1 of process 1 (pid in its namespace) through CUDA IPC, "
                             "which is not in the dumped tree"));
  agent::StatusReply outside = owner_status;
  outside.ipc_exports.push_back({.allocation = 5, .importer_pid = 0});
  plugin::IpcParty owner_outside{.pid = 100, .vpid = 1, .status = &outside, .allocations = &owner_allocs};
  auto outsider = plugin::check_ipc_tree({owner_outside, importer});
  REQUIRE_FALSE(outsider.ok());
  CHECK_THAT(outsider.error().message, Catch::Contains("#5 is open through CUDA IPC in a process outside its pid namespace"));
  // The owner freed it (or it is another size now): the mapping names nothing.
  std::vector<agent::Allocation> freed = {owned(5, 0x2000000)};
  plugin::IpcParty owner_freed{.pid = 100, .vpid = 1, .status = &importer_status, .allocations = &freed};
  auto gone = plugin::check_ipc_tree({owner_freed, importer});
  REQUIRE_FALSE(gone.ok());
  CHECK_THAT(gone.error().message, Catch::Contains("which that process no longer has as such"));
}

TEST_CASE("ipc event handle: phos's completed-event handle, told apart from the driver's", "[ipc]") {
  const auto bytes = agent::encode_ipc_event_handle(31);
  auto pid = agent::decode_ipc_event_handle(bytes.data());
  REQUIRE(pid);
  CHECK(*pid == 31);
  std::array<uint8_t, 64> zeros{};
  CHECK_FALSE(agent::decode_ipc_event_handle(zeros.data()));
  auto damaged = bytes;
  damaged[9] ^= 1;
  CHECK_FALSE(agent::decode_ipc_event_handle(damaged.data()));
  // A memory handle is no event handle, and the reverse.
  CHECK_FALSE(agent::decode_ipc_event_handle(agent::encode_ipc_handle(sample_handle()).data()));
  CHECK_FALSE(agent::decode_ipc_handle(bytes.data()));
}

TEST_CASE("interprocess events: known from add to forget, counted once", "[ipc]") {
  phos::hooks::InterprocessEvents events;
  int a = 0, b = 0;
  CHECK_FALSE(events.contains(&a));
  events.forget(&a);  // a plain event's destroy: nothing to forget
  CHECK(events.size() == 0);
  events.add(&a);
  events.add(&a);  // its IPC handle taken after an interprocess create
  events.add(&b);
  CHECK(events.size() == 2);
  CHECK(events.contains(&a));
  CHECK(events.contains(&b));
  events.forget(&a);
  CHECK_FALSE(events.contains(&a));  // the driver may hand its handle out again, for a plain event
  CHECK(events.contains(&b));
  CHECK(events.size() == 1);
  events.forget(&a);
  CHECK(events.size() == 1);
  events.forget(&b);
  CHECK(events.size() == 0);
  CHECK_FALSE(events.contains(&b));
}

TEST_CASE("interprocess events: all forgotten at a context's end", "[ipc]") {
  phos::hooks::InterprocessEvents events;
  int a = 0, b = 0;
  events.add(&a);
  events.add(&b);
  events.clear();  // cuCtxDestroy, cuDevicePrimaryCtxReset: the context's events are gone
  CHECK(events.size() == 0);
  CHECK_FALSE(events.contains(&a));
  CHECK_FALSE(events.contains(&b));
  events.add(&a);  // counted again from nothing
  CHECK(events.size() == 1);
  CHECK(events.contains(&a));
}
