// The agent protocol's and the keeper link's codecs (images/agent_protocol.h,
// images/keeper_protocol.h): every message through encode and decode, the
// bytes of agent.proto kept, what an older agent leaves out, and malformed
// payloads refused with what is wrong. Payloads that phos never writes are
// written here by hand, field by field.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "fixtures.h"
#include "phos/images/agent_protocol.h"
#include "phos/images/keeper_protocol.h"

using namespace phos;
using phos::test::PbWriter;

namespace {

std::string hex(const std::vector<std::byte>& b) {
  std::string out;
  char buf[3];
  for (auto x : b) {
    std::snprintf(buf, sizeof(buf), "%02x", unsigned(x));
    out += buf;
  }
  return out;
}

// A StatusReply with its required fields only, as an agent from before
// speculation and device UUIDs sent it.
PbWriter old_status() { return PbWriter().varint(1, 1).varint(2, 1).varint(3, 2).varint(4, 4096).varint(5, 1); }

PbWriter status_reply(const PbWriter& status) { return PbWriter().message(2, status); }

agent::KernelSpeculation kernel(std::string name, uint64_t launches) {
  agent::KernelSpeculation k;
  k.name = std::move(name);
  k.module = 3;
  k.launches = launches;
  k.exact = 1;
  k.speculated = launches - 1;
  k.buffers = 2 * launches;
  k.reads = launches;
  k.writes = launches;
  k.types = "sigdb";
  return k;
}

agent::StatusReply full_status() {
  agent::StatusReply s;
  s.gate_open = true;
  s.cuda_initialized = true;
  s.allocation_count = 2;
  s.allocated_bytes = 4u << 20;
  s.device_count = 2;
  s.unsupported_calls = {"cudaMallocManaged"};
  s.counters = {{"launches", 42}, {"live_blocks", 2}};
  s.modules = {{.id = 1,
                .kind = "fatbin",
                .size = 4096,
                .hash = 0x1234abcd,
                .source = "cuLibraryLoadData",
                .functions = {"vec_add", "scale"},
                .function_count = 2,
                .globals = {"table"}},
               {.id = 2,
                .kind = "file",
                .size = 0,
                .hash = 0,
                .source = "/tmp/x.cubin",
                .functions = {},
                .function_count = 0,
                .globals = {}}};
  s.speculation_active = true;
  s.indexed_buffers = 17;
  s.kernels = {kernel("_Z7vec_addPKfS0_Pfi", 10), kernel("plain", 1)};
  s.kernels[0].note = "cubin says 5 parameters, the name 4";
  s.kernel_count = 2;
  s.devices = {{0, {}}, {1, {}}};
  s.validation_active = true;
  s.nccl_communicators = {{.rank = 1,
                           .nranks = 4,
                           .device = 0,
                           .job_id = 0xfeedfacecafebeefull,
                           .calls = 12,
                           .single_process = false,
                           .stop_at = 12,
                           .held = true},
                          {.rank = 0,
                           .nranks = 2,
                           .device = 1,
                           .job_id = 0x1234,
                           .calls = 0,
                           .single_process = true,
                           .stop_at = {},
                           .held = false,
                           .released = true,
                           .rebuilds = 3}};
  s.call_cycles = agent::CallCycles{.cycles_per_second = 2.6e9,
                                    .calls = {{"cuLaunchKernel", 374, 19448, 7480}, {"cublasSgemm_v2", 2, 104, 40}},
                                    .floor_cycles_per_call = 21.5};
  for (uint8_t i = 0; i < 16; i++) {
    s.devices[0].uuid[i] = i;
    s.devices[1].uuid[i] = uint8_t(0xf0 | i);
  }
  return s;
}

agent::Request round_trip(const agent::Request& r) {
  auto decoded = agent::decode_request(agent::encode_request(r));
  REQUIRE(decoded.ok());
  return std::move(decoded.value());
}

agent::Reply round_trip(const agent::Reply& r) {
  auto decoded = agent::decode_reply(agent::encode_reply(r));
  REQUIRE(decoded.ok());
  return std::move(decoded.value());
}

// The error decoding `payload` as a reply must give.
Error reply_error(const PbWriter& payload) {
  auto r = agent::decode_reply(payload.payload());
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == EPROTO);
  return r.error();
}

Error request_error(const PbWriter& payload) {
  auto r = agent::decode_request(payload.payload());
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == EPROTO);
  return r.error();
}

using phos::test::SocketPair;

}  // namespace

TEST_CASE("agent protocol: every request round trips", "[agent_protocol]") {
  const std::vector<agent::Request> requests = {
      agent::Hello{agent::kProtocolVersion, "0.1.0"},
      agent::StatusRequest{},
      agent::ListAllocationsRequest{253, 253, true},
      agent::ListAllocationsRequest{0, 10, false},
      agent::QuiesceRequest{5000},
      agent::ReleaseMappingsRequest{true},
      agent::ReleaseMappingsRequest{false},
      agent::RemapRequest{{5, 6, 1ull << 40}},
      agent::RemapRequest{},
      agent::ResumeRequest{},
      agent::ResumeRequest{0x0123456789abcdefull},
      agent::GoodbyeRequest{},
      agent::SpeculateRequest{true, std::nullopt},
      agent::SpeculateRequest{false, std::nullopt},
      agent::SpeculateRequest{true, true},
      agent::SpeculateRequest{true, false},
      agent::NcclStopRequest{0xfeedfacecafebeefull, 40, std::nullopt, std::nullopt},
      agent::NcclStopRequest{0x1234, std::nullopt, std::nullopt, std::nullopt},
      agent::NcclStopRequest{0x1234, std::nullopt, true, std::nullopt},
      agent::NcclStopRequest{0x1234, 7, false, std::nullopt},
      agent::NcclStopRequest{0x1234, 7, std::nullopt, 10000},
      agent::OpenCopyWindowRequest{agent::CopyTrust::kValidated, 60000, {{1, 2ull << 30, 1024}}},
      agent::OpenCopyWindowRequest{agent::CopyTrust::kExact, 1, {}},
      agent::OpenCopyWindowRequest{agent::CopyTrust::kChecksum, 60000, {{0, 1ull << 30, 512}, {1, 4ull << 20, 2}}},
      agent::CloseCopyWindowRequest{},
      agent::CloseCopyWindowRequest{.missed = true, .missed_chunks = {}},
      agent::CloseCopyWindowRequest{.missed = true, .missed_chunks = {{0x7f0000400000, 4u << 20}, {0x1000, 4096}}},
      agent::IpcOpenRequest{.allocation = 3},
      agent::IpcCloseRequest{.allocation = 1ull << 40},
  };
  for (const auto& r : requests) {
    INFO(agent::kind_name(r));
    CHECK(round_trip(r) == r);
  }
  std::vector<bool> seen(std::variant_size_v<agent::Request>);
  for (const auto& r : requests) seen[r.index()] = true;
  CHECK(std::find(seen.begin(), seen.end(), false) == seen.end());  // every kind
}

TEST_CASE("agent protocol: every reply round trips", "[agent_protocol]") {
  const std::vector<agent::Reply> replies = {
      agent::HelloReply{agent::kProtocolVersion, "0.1.0", 4242, 4243, 1000},
      full_status(),
      agent::StatusReply{},
      agent::ListAllocationsReply{{{1, 0, 0x7f0000000000ull, 2u << 20, 0}, {9, 1, 0x7f0000400000ull, 4096, 1}}, 300},
      agent::ListAllocationsReply{{}, 0},
      agent::QuiesceReply{123456789, false, {}},
      agent::QuiesceReply{5, true, {7, 3, 12}},
      agent::QuiesceReply{9, false, {}, 2, 41000000},
      agent::QuiesceReply{9, true, {}, 0, 0, {{0x7f0000000000ull, 4u << 20}, {0x7f0000800000ull, 8192}}},
      agent::QuiesceReply{9, true, {}, 0, 0, {}, 17},
      agent::ReleaseMappingsReply{6u << 20},
      agent::RemapReply{6u << 20},
      agent::ResumeReply{},
      agent::GoodbyeReply{},
      agent::SpeculateReply{std::nullopt, false},
      agent::SpeculateReply{true, true},
      agent::SpeculateReply{false, false},
      agent::NcclStopReply{true},
      agent::NcclStopReply{false},
      agent::IpcOpenReply{.size = 2ull << 20, .device = 1},
      agent::IpcCloseReply{},
      agent::OpenCopyWindowReply{true},
      agent::CloseCopyWindowReply{},
      agent::CloseCopyWindowReply{
          .counters = {.calls_checked = 12, .calls_waited = 4, .unknown_waits = 1, .wait_ns = 5000000},
          .chunks_saved = 3,
          .violations = 2,
          .violation = "kernel k wrote outside its speculated set",
          .aborted = true,
          .abort_reason = "chunk 7 was not copied in time",
          .speculated_kernels = {},
          .speculated_kernel_count = 0,
          .unmarked_calls = 0,
          .suspects = {},
          .longest_waits = {},
          .most_saved = {}},
      agent::CloseCopyWindowReply{.counters = {.calls_checked = 217},
                                  .chunks_saved = 0,
                                  .violations = 0,
                                  .violation = "",
                                  .aborted = false,
                                  .abort_reason = "",
                                  .speculated_kernels = {{"ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40},
                                                         {"void at::native::vectorized_elementwise_kernel<4>", 3}},
                                  .speculated_kernel_count = 7,
                                  .unmarked_calls = 12,
                                  .suspects = {{"void at::native::vectorized_elementwise_kernel<4>", 3}},
                                  .longest_waits = {{"kernel launch", "void at::native::cat_kernel", 1712000000, 537, 0},
                                                    {"cuMemcpyAsync", "", 20000000, 5, 2, 1500000, 18000000}},
                                  .most_saved = {{"cuMemcpyDtoDAsync_v2", "", 0, 0, 537}}},
  };
  for (const auto& r : replies) {
    INFO(agent::kind_name(r));
    // Reply holds a phos::Error, which has no ==: compare alternatives.
    auto back = round_trip(r);
    REQUIRE(back.index() == r.index());
    std::visit(
        [&](const auto& want) {
          using T = std::decay_t<decltype(want)>;
          if constexpr (!std::is_same_v<T, Error>) CHECK(std::get<T>(back) == want);
        },
        r);
  }
  auto error = round_trip(make_error("release mappings needs a quiesced process", EBUSY));
  REQUIRE(std::holds_alternative<Error>(error));
  CHECK(std::get<Error>(error).code == EBUSY);
  CHECK(std::get<Error>(error).message == "release mappings needs a quiesced process");
}

TEST_CASE("agent protocol: the bytes are agent.proto's", "[agent_protocol]") {
  // Written by the hand-built protobuf-c code that came before the codec;
  // an agent and a plugin of different builds must understand each other.
  CHECK(hex(agent::encode_request(agent::Hello{1, "0.1.0"})) == "0a0908011205302e312e30");
  CHECK(hex(agent::encode_request(agent::SpeculateRequest{true, false})) == "4a0408011000");
  CHECK(hex(agent::encode_request(agent::ReleaseMappingsRequest{false})) == "2a020800");
  CHECK(hex(agent::encode_reply(agent::ListAllocationsReply{{{1, 0, 0x7f0000000000ull, 2u << 20, 0}}, 9})) ==
        "1a170a1308011000188080808080e01f208080800128001009");
  CHECK(hex(keeper::encode_message(keeper::Hold{42, {{1, 0, 0x7f0000000000ull, 2u << 20, 0}}})) ==
        "0a17082a121308011000188080808080e01f20808080012800");
}

TEST_CASE("agent protocol: a status reply carries at most 1000 kernels and function names", "[agent_protocol]") {
  agent::StatusReply s;
  for (uint64_t i = 1; i <= 1500; i++) s.kernels.push_back(kernel("k" + std::to_string(i), i));
  std::vector<std::string> many;
  for (int i = 0; i < 1200; i++) many.push_back("f" + std::to_string(i));
  s.modules = {{7, "cubin", 100, 1, "cuModuleLoad", many, 0, {}}};
  auto back = std::get<agent::StatusReply>(round_trip(s));
  REQUIRE(back.kernels.size() == agent::kMaxStatusKernels);
  CHECK(back.kernel_count == 1500);
  CHECK(back.kernels.front().name == "k1500");  // most launches first
  CHECK(back.kernels.back().launches == 501);
  REQUIRE(back.modules.size() == 1);
  CHECK(back.modules[0].functions.size() == agent::kMaxModuleFunctions);
  CHECK(back.modules[0].functions.front() == "f0");
  CHECK(back.modules[0].function_count == 1200);
}

TEST_CASE("agent protocol: what an older agent leaves out reads as off and empty", "[agent_protocol][compat]") {
  auto status = agent::decode_reply(status_reply(old_status()).payload());
  REQUIRE(status.ok());
  const auto& s = std::get<agent::StatusReply>(*status);
  CHECK(s.gate_open);
  CHECK(s.allocation_count == 2);
  CHECK_FALSE(s.speculation_active);
  CHECK(s.indexed_buffers == 0);
  CHECK(s.kernels.empty());
  CHECK(s.kernel_count == 0);
  CHECK(s.devices.empty());
  CHECK_FALSE(s.call_cycles.has_value());

  // Kernels but no kernel_count: the kernels are all there are.
  PbWriter k;
  k.text(1, "vec_add").varint(2, 0).varint(3, 4).varint(4, 0).varint(5, 4).varint(6, 0);
  k.varint(7, 8).varint(8, 4).varint(9, 4).text(10, "name");
  auto counted = agent::decode_reply(status_reply(old_status().message(11, k)).payload());
  REQUIRE(counted.ok());
  const auto& c = std::get<agent::StatusReply>(*counted);
  REQUIRE(c.kernels.size() == 1);
  CHECK(c.kernels[0].note.empty());
  CHECK(c.kernel_count == 1);

  // A speculate reply from before validation.
  auto speculate = agent::decode_reply(PbWriter().message(9, PbWriter()).payload());
  REQUIRE(speculate.ok());
  CHECK(std::get<agent::SpeculateReply>(*speculate) == agent::SpeculateReply{std::nullopt, false});

  // A release request from a client that left release_handles out.
  auto release = agent::decode_request(PbWriter().message(5, PbWriter()).payload());
  REQUIRE(release.ok());
  CHECK(std::get<agent::ReleaseMappingsRequest>(*release) == agent::ReleaseMappingsRequest{false});
}

TEST_CASE("agent protocol: a status's call counts are agent.proto's field 17", "[agent_protocol][call_cycles]") {
  PbWriter cost;
  cost.text(1, "cuLaunchKernel").varint(2, 7).varint(3, 700).varint(4, 280);
  auto status =
      agent::decode_reply(status_reply(old_status().message(17, PbWriter().float64(1, 2.5e9).message(2, cost))).payload());
  REQUIRE(status.ok());
  const auto& s = std::get<agent::StatusReply>(*status);
  REQUIRE(s.call_cycles.has_value());
  CHECK(*s.call_cycles == agent::CallCycles{2.5e9, {{"cuLaunchKernel", 7, 700, 280}}});

  // The counter on, no call yet: present and empty, not absent.
  agent::StatusReply none;
  none.call_cycles = agent::CallCycles{1e9, {}};
  CHECK(std::get<agent::StatusReply>(round_trip(none)).call_cycles == none.call_cycles);

  // A kind without its ns is refused.
  PbWriter partial;
  partial.text(1, "cuLaunchKernel").varint(2, 7).varint(3, 700);
  reply_error(status_reply(old_status().message(17, PbWriter().float64(1, 2.5e9).message(2, partial))));
}

TEST_CASE("agent protocol: a device UUID that is not 16 bytes is refused", "[agent_protocol][malformed]") {
  std::byte three[3] = {std::byte{1}, std::byte{2}, std::byte{3}};
  PbWriter device;
  device.varint(1, 2).bytes(2, three);
  auto e = reply_error(status_reply(old_status().message(13, device)));
  CHECK_THAT(e.message,
             Catch::Contains("malformed reply") && Catch::Contains("device 2 has a UUID of 3 bytes, not 16"));
}

TEST_CASE("agent protocol: an unknown kind is refused, naming its field", "[agent_protocol][malformed]") {
  CHECK_THAT(request_error(PbWriter().message(16, PbWriter())).message,
             Catch::Contains("malformed request: unknown kind (field 16)"));
  CHECK_THAT(reply_error(PbWriter().varint(16, 1)).message,
             Catch::Contains("malformed reply: unknown kind (field 16)"));
  CHECK_THAT(request_error(PbWriter()).message, Catch::Contains("malformed request: no kind"));
  CHECK_THAT(reply_error(PbWriter()).message, Catch::Contains("malformed reply: no kind"));
}

TEST_CASE("agent protocol: a missing required field is refused", "[agent_protocol][malformed]") {
  // Hello without its client_version.
  CHECK_THAT(request_error(PbWriter().message(1, PbWriter().varint(1, 1))).message,
             Catch::Contains("malformed request: payload does not parse") && Catch::Contains("required field"));
  // A status reply without allocated_bytes.
  PbWriter status;
  status.varint(1, 1).varint(2, 1).varint(3, 2).varint(5, 1);
  CHECK_THAT(reply_error(status_reply(status)).message, Catch::Contains("malformed reply: payload does not parse"));
  // An allocation without its address.
  PbWriter alloc;
  alloc.varint(1, 1).varint(2, 0).varint(4, 4096).varint(5, 0);
  CHECK_THAT(reply_error(PbWriter().message(3, PbWriter().message(1, alloc).varint(2, 1))).message,
             Catch::Contains("malformed reply: payload does not parse"));
}

TEST_CASE("agent protocol: a payload that does not parse is refused", "[agent_protocol][malformed]") {
  std::vector<std::byte> junk(16, std::byte{0xff});
  auto req = agent::decode_request(junk);
  REQUIRE_FALSE(req.ok());
  CHECK(req.error().code == EPROTO);
  CHECK_THAT(req.error().message, Catch::Contains("malformed request: payload does not parse"));
  auto rep = agent::decode_reply(junk);
  REQUIRE_FALSE(rep.ok());
  CHECK(rep.error().code == EPROTO);
  // A length that runs past the payload's end.
  std::vector<std::byte> cut = agent::encode_reply(full_status());
  cut.resize(cut.size() / 2);
  auto half = agent::decode_reply(cut);
  REQUIRE_FALSE(half.ok());
  CHECK(half.error().code == EPROTO);
}

TEST_CASE("agent protocol: counts that do not add up are refused", "[agent_protocol][malformed]") {
  PbWriter k;
  k.text(1, "a").varint(2, 0).varint(3, 1).varint(4, 0).varint(5, 1).varint(6, 0);
  k.varint(7, 1).varint(8, 1).varint(9, 0).text(10, "none");
  CHECK_THAT(reply_error(status_reply(old_status().message(11, k).message(11, k).varint(12, 1))).message,
             Catch::Contains("kernel count 1 is below the 2 kernels"));

  PbWriter module;
  module.varint(1, 4).text(2, "cubin").varint(3, 0).varint(4, 0).text(5, "x").text(6, "f").text(6, "g").varint(7, 1);
  CHECK_THAT(reply_error(status_reply(old_status().message(8, module))).message,
             Catch::Contains("module 4 counts 1 functions but names 2"));

  PbWriter alloc;
  alloc.varint(1, 1).varint(2, 0).varint(3, 1 << 21).varint(4, 4096).varint(5, 0);
  CHECK_THAT(reply_error(PbWriter().message(3, PbWriter().message(1, alloc).message(1, alloc).varint(2, 1))).message,
             Catch::Contains("list allocations: 2 allocations of a total of 1"));
}

TEST_CASE("agent protocol: an error reply must carry an errno", "[agent_protocol][malformed]") {
  // Returned as an error with code 0, it would read as success.
  CHECK_THAT(reply_error(PbWriter().message(15, PbWriter().varint(1, 0).text(2, "fine"))).message,
             Catch::Contains("error reply with code 0"));
  CHECK_THAT(reply_error(PbWriter().message(15, PbWriter().varint(1, uint64_t(-5)).text(2, "x"))).message,
             Catch::Contains("error reply with code -5"));
}

TEST_CASE("agent protocol: requests and replies travel with their fds", "[agent_protocol][fds]") {
  SocketPair s;
  int p[2];
  REQUIRE(::pipe(p) == 0);
  REQUIRE(agent::send_request(s.a.get(), agent::RemapRequest{{5, 6}}, std::vector<int>{p[0], p[1]}).ok());
  ::close(p[0]);
  ::close(p[1]);
  auto req = agent::recv_request(s.b.get(), 1000);
  REQUIRE(req.ok());
  CHECK(std::get<agent::RemapRequest>(req->request).allocation_ids == std::vector<uint64_t>{5, 6});
  REQUIRE(req->fds.size() == 2);
  char c = 'x', got = 0;
  REQUIRE(::write(req->fds[1].get(), &c, 1) == 1);
  REQUIRE(::read(req->fds[0].get(), &got, 1) == 1);
  CHECK(got == 'x');

  agent::ListAllocationsReply list{{{1, 0, 0x7f0000000000ull, 4096, 0}}, 1};
  REQUIRE(agent::send_reply(s.b.get(), list).ok());
  auto rep = agent::recv_reply(s.a.get(), 1000);
  REQUIRE(rep.ok());
  CHECK(std::get<agent::ListAllocationsReply>(rep->reply) == list);
  CHECK(rep->fds.empty());

  // What does not decode comes back as EPROTO from recv.
  std::vector<std::byte> junk(4, std::byte{0xff});
  REQUIRE(wire::send_frame(s.a.get(), junk).ok());
  auto bad = agent::recv_request(s.b.get(), 1000);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code == EPROTO);
}

TEST_CASE("agent protocol: kinds are named as agent.proto names them", "[agent_protocol]") {
  CHECK(agent::kind_name(agent::Request(agent::ListAllocationsRequest{})) == "list_allocations");
  CHECK(agent::kind_name(agent::Request(agent::SpeculateRequest{})) == "speculate");
  CHECK(agent::kind_name(agent::Reply(agent::HelloReply{})) == "hello");
  CHECK(agent::kind_name(agent::Reply(make_error("x", EIO))) == "error");
}

TEST_CASE("keeper protocol: every message round trips, with its fds", "[agent_protocol][keeper]") {
  const std::vector<keeper::Message> messages = {
      keeper::Hold{42, {{1, 0, 0x7f0000000000ull, 2u << 20, 0}, {2, 1, 0x7f0000200000ull, 4096, 1}}},
      keeper::Hold{43, {}},
      keeper::State{42, 1 | 2 | 4},
      keeper::Done{},
      keeper::Restoring{44, false},
      keeper::Restoring{44, true},
      keeper::RestoreStarted{4242},
      keeper::Keep{42, "0123456789abcdef", {{1, 0, 0x7f0000000000ull, 2u << 20, 0}}, 1, 600},
      keeper::Keep{43, "0123456789abcdef", {}, 7, 1},
      keeper::KeepCommitted{42},
      keeper::TakeKept{"0123456789abcdef", 1},
      keeper::Kept{{{1, 0, 0x7f0000000000ull, 2u << 20, 0}}, true, ""},
      keeper::Kept{{}, false, ""},
      keeper::Kept{{}, true, "no memory kept for process 3"},
      keeper::Taken{1, true},
      keeper::Taken{1, false},
  };
  for (const auto& m : messages) {
    auto back = keeper::decode_message(keeper::encode_message(m));
    REQUIRE(back.ok());
    CHECK(*back == m);
  }
  SocketPair s;
  int p[2];
  REQUIRE(::pipe(p) == 0);
  REQUIRE(keeper::send_message(s.a.get(), messages[0], std::vector<int>{p[0], p[1]}).ok());
  ::close(p[0]);
  ::close(p[1]);
  auto got = keeper::recv_message(s.b.get(), 1000);
  REQUIRE(got.ok());
  CHECK(got->message == messages[0]);
  CHECK(got->fds.size() == 2);
}

TEST_CASE("keeper protocol: a migration's kept memory socket is named after it", "[agent_protocol][keeper][migrate]") {
  CHECK(keeper::kept_socket_name("0123456789abcdef") == "phos-kept.0123456789abcdef");
}

TEST_CASE("keeper protocol: kept memory goes with its fds, frame by frame", "[agent_protocol][keeper][migrate]") {
  SocketPair s;
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const keeper::Kept first{{{1, 0, 0x7f0000000000ull, 2u << 20, 0}}, false, ""};
  const keeper::Kept last{{{2, 0, 0x7f0000200000ull, 2u << 20, 0}}, true, ""};
  REQUIRE(keeper::send_message(s.a.get(), first, std::vector<int>{p[0]}).ok());
  REQUIRE(keeper::send_message(s.a.get(), last, std::vector<int>{p[1]}).ok());
  ::close(p[0]);
  ::close(p[1]);
  for (const auto& want : {first, last}) {
    auto got = keeper::recv_message(s.b.get(), 1000);
    REQUIRE(got.ok());
    CHECK(got->message == keeper::Message(want));
    CHECK(got->fds.size() == 1);
  }
}

TEST_CASE("keeper protocol: a malformed message is refused", "[agent_protocol][keeper][malformed]") {
  std::vector<std::byte> junk(8, std::byte{0xff});
  auto bad = keeper::decode_message(junk);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code == EPROTO);
  CHECK_THAT(bad.error().message, Catch::Contains("malformed keeper message: payload does not parse"));
  auto unknown = keeper::decode_message(PbWriter().message(15, PbWriter()).payload());
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(unknown.error().message, Catch::Contains("unknown kind (field 15)"));
}

// --- what the codecs share (images/src/pb_codec.h) ---

TEST_CASE("codecs: a payload that does not parse is refused naming the message it is not",
          "[agent_protocol][keeper][malformed][pb_codec]") {
  std::vector<std::byte> junk(8, std::byte{0xff});
  auto request = agent::decode_request(junk);
  auto reply = agent::decode_reply(junk);
  auto message = keeper::decode_message(junk);
  REQUIRE_FALSE(request.ok());
  REQUIRE_FALSE(reply.ok());
  REQUIRE_FALSE(message.ok());
  for (const Error* e : {&request.error(), &reply.error(), &message.error()}) CHECK(e->code == EPROTO);
  CHECK(request.error().message ==
        "malformed request: payload does not parse (not a request, or a required field is missing)");
  CHECK(reply.error().message ==
        "malformed reply: payload does not parse (not a reply, or a required field is missing)");
  CHECK(message.error().message ==
        "malformed keeper message: payload does not parse (not a keeper message, or a required field is missing)");
}

TEST_CASE("codecs: an envelope without a kind is refused naming the envelope",
          "[agent_protocol][keeper][malformed][pb_codec]") {
  CHECK_THAT(request_error(PbWriter()).message, Catch::Equals("malformed request: no kind"));
  CHECK_THAT(reply_error(PbWriter()).message, Catch::Equals("malformed reply: no kind"));
  auto none = keeper::decode_message(PbWriter().payload());
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().code == EPROTO);
  CHECK(none.error().message == "malformed keeper message: no kind");
  auto unknown = keeper::decode_message(PbWriter().message(11, PbWriter()).payload());
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().message == "malformed keeper message: unknown kind (field 11)");
}

TEST_CASE("codecs: repeated messages keep their order and each item's fields, in every envelope",
          "[agent_protocol][keeper][pb_codec]") {
  // Three allocations through the one Allocation codec the agent's listing,
  // the keeper's Hold, Keep and Kept share.
  const std::vector<agent::Allocation> allocs = {
      {.id = 3, .device = 1, .address = 0x7f0000000000ull, .size = 4096, .flags = 1},
      {.id = 1, .device = 0, .address = 0x7f0000100000ull, .size = 2u << 20, .flags = 0},
      {.id = 2, .device = 2, .address = 0x7f0000400000ull, .size = 8192, .flags = 3},
  };
  auto listed = round_trip(agent::Reply(agent::ListAllocationsReply{.allocations = allocs, .total_count = 3}));
  CHECK(std::get<agent::ListAllocationsReply>(listed).allocations == allocs);
  for (const keeper::Message& m :
       {keeper::Message(keeper::Hold{.pid = 7, .allocations = allocs}),
        keeper::Message(
            keeper::Keep{.pid = 7, .migration = "0123456789abcdef", .allocations = allocs, .vpid = 1, .keep_s = 60}),
        keeper::Message(keeper::Kept{.allocations = allocs, .last = true, .error = ""})}) {
    auto back = keeper::decode_message(keeper::encode_message(m));
    REQUIRE(back.ok());
    CHECK(*back == m);
  }
  // None: an empty repeated field, not a missing one.
  auto empty = keeper::decode_message(keeper::encode_message(keeper::Hold{.pid = 7, .allocations = {}}));
  REQUIRE(empty.ok());
  CHECK(std::get<keeper::Hold>(*empty).allocations.empty());
}

// --- the copy window's requests as another build might send them ---

namespace {

// An OpenCopyWindowRequest (Request field 10) with every required field.
PbWriter open_copy_window(uint64_t trust) {
  return PbWriter().message(
      10, PbWriter().varint(1, trust).varint(2, 60000).message(5, PbWriter().varint(1, 0).varint(2, 1ull << 30).varint(3, 512)));
}

}  // namespace

TEST_CASE("agent protocol: an open copy window request with trust 0 is refused", "[agent_protocol][malformed]") {
  auto e = request_error(open_copy_window(0));
  CHECK_THAT(e.message, Catch::Contains("malformed request") && Catch::Contains("open copy window: trust 0") &&
                            Catch::Contains("none of 1, 2, 3, 4"));
}

TEST_CASE("agent protocol: an open copy window request with trust 5 is refused", "[agent_protocol][malformed]") {
  auto e = request_error(open_copy_window(5));
  CHECK_THAT(e.message, Catch::Contains("malformed request") && Catch::Contains("open copy window: trust 5"));
}

TEST_CASE("agent protocol: every trust in 1..4 written by hand is accepted", "[agent_protocol]") {
  for (uint64_t t : {1, 2, 3, 4}) {
    INFO("trust " << t);
    auto r = agent::decode_request(open_copy_window(t).payload());
    REQUIRE(r.ok());
    const auto& q = std::get<agent::OpenCopyWindowRequest>(*r);
    CHECK(uint32_t(q.trust) == t);
    CHECK(q.timeout_ms == 60000);
    CHECK(q.pools == std::vector<agent::CopyPool>{{.device = 0, .bytes = 1ull << 30, .slots = 512}});
  }
}

TEST_CASE("agent protocol: an open copy window request carries a pool per GPU, in order",
          "[agent_protocol][multi_gpu]") {
  const agent::OpenCopyWindowRequest q{.trust = agent::CopyTrust::kChecksum,
                                       .timeout_ms = 5,
                                       .pools = {{.device = 1, .bytes = 6ull << 20, .slots = 3},
                                                 {.device = 0, .bytes = 2ull << 20, .slots = 1}}};
  auto r = agent::decode_request(agent::encode_request(q));
  REQUIRE(r.ok());
  const auto& got = std::get<agent::OpenCopyWindowRequest>(*r);
  CHECK(got == q);
  REQUIRE(got.pools.size() == 2);
  CHECK(got.pools[0].device == 1);  // the order numbers the slots: kept
  CHECK(got.pools[1].slots == 1);
}

TEST_CASE("agent protocol: two pools on one GPU are refused", "[agent_protocol][multi_gpu][malformed]") {
  auto pool = [] { return PbWriter().varint(1, 1).varint(2, 2ull << 20).varint(3, 1); };
  auto e = request_error(PbWriter().message(10, PbWriter().varint(1, 1).varint(2, 1).message(5, pool()).message(5, pool())));
  CHECK_THAT(e.message, Catch::Contains("malformed request") && Catch::Contains("two pools on device 1"));
}

TEST_CASE("agent protocol: an open copy window request without its trust is refused",
          "[agent_protocol][malformed]") {
  PbWriter q = PbWriter().message(10, PbWriter().varint(2, 60000).varint(3, 0).varint(4, 0));
  CHECK_THAT(request_error(q).message, Catch::Contains("malformed request: payload does not parse"));
}

TEST_CASE("agent protocol: a close copy window reply without its required figures is refused",
          "[agent_protocol][malformed]") {
  // calls_checked only: the rest of the required fields missing.
  CHECK_THAT(reply_error(PbWriter().message(11, PbWriter().varint(1, 5))).message,
             Catch::Contains("malformed reply: payload does not parse"));
}

TEST_CASE("agent protocol: a close copy window reply without its optional texts reads them empty",
          "[agent_protocol][compat]") {
  PbWriter c;
  c.varint(1, 1).varint(2, 2).varint(3, 3).varint(4, 4).varint(5, 5).varint(6, 0).varint(8, 0);
  auto r = agent::decode_reply(PbWriter().message(11, c).payload());
  REQUIRE(r.ok());
  const auto& got = std::get<agent::CloseCopyWindowReply>(*r);
  CHECK(got == agent::CloseCopyWindowReply{
                   .counters = {.calls_checked = 1, .calls_waited = 3, .unknown_waits = 4, .wait_ns = 5},
                   .chunks_saved = 2,
                   .violations = 0,
                   .violation = "",
                   .aborted = false,
                   .abort_reason = "",
                   .speculated_kernels = {},
                   .speculated_kernel_count = 0,
                   .unmarked_calls = 0,
                   .suspects = {},
                   .longest_waits = {},
                   .most_saved = {}});
}

TEST_CASE("agent protocol: trust 4 (checksum) opens a window, 5 is refused as malformed", "[agent_protocol][checksum]") {
  auto ok = agent::decode_request(agent::encode_request(
      agent::OpenCopyWindowRequest{.trust = agent::CopyTrust::kChecksum, .timeout_ms = 1, .pools = {}}));
  REQUIRE(ok.ok());
  CHECK(std::get<agent::OpenCopyWindowRequest>(*ok).trust == agent::CopyTrust::kChecksum);
  auto bad = agent::decode_request(agent::encode_request(
      agent::OpenCopyWindowRequest{.trust = agent::CopyTrust(5), .timeout_ms = 1, .pools = {}}));
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message, Catch::Contains("trust 5 is none of 1, 2, 3, 4"));
}

TEST_CASE("agent protocol: an older agent's status and close reply read as no miss, no kernels",
          "[agent_protocol][compat][checksum]") {
  CHECK_FALSE(std::get<agent::StatusReply>(round_trip(agent::StatusReply{})).cow_missed);
  agent::StatusReply missed;
  missed.cow_missed = true;
  CHECK(std::get<agent::StatusReply>(round_trip(missed)).cow_missed);
  // An empty close request (an older plugin) reads as not missed.
  auto q = agent::decode_request(agent::encode_request(agent::CloseCopyWindowRequest{}));
  REQUIRE(q.ok());
  CHECK_FALSE(std::get<agent::CloseCopyWindowRequest>(*q).missed);
}

TEST_CASE("agent protocol: the copy window kinds are named as agent.proto names them", "[agent_protocol]") {
  CHECK(agent::kind_name(agent::Request(agent::OpenCopyWindowRequest{})) == "open_copy_window");
  CHECK(agent::kind_name(agent::Request(agent::CloseCopyWindowRequest{})) == "close_copy_window");
  CHECK(agent::kind_name(agent::Reply(agent::OpenCopyWindowReply{})) == "open_copy_window");
  CHECK(agent::kind_name(agent::Reply(agent::CloseCopyWindowReply{})) == "close_copy_window");
}

// --- gpu.proto: the Device and Allocation the agent, the keeper and the image share ---

TEST_CASE("agent protocol: a status device's name and memory, where sent, are read", "[agent_protocol][gpu]") {
  agent::StatusReply s;
  s.devices = {{.ordinal = 1, .uuid = {}, .name = "NVIDIA H200", .total_memory = 150ull << 30, .compute_major = 9}};
  s.devices[0].uuid.fill(0x5a);
  CHECK(std::get<agent::StatusReply>(round_trip(s)).devices == s.devices);
}

TEST_CASE("agent protocol: an allocation's chunks, which only an image has, are not read from an agent or a keeper",
          "[agent_protocol][keeper][gpu]") {
  PbWriter chunk;
  chunk.varint(1, 0).varint(2, 0).varint(3, 4096).varint(4, 4096).varint(5, 4096).varint(6, 1).varint(7, 0);
  PbWriter alloc;
  alloc.varint(1, 9).varint(2, 1).varint(3, 0x7f0000000000ull).varint(4, 4096).varint(5, 2).message(6, chunk);
  const agent::Allocation want{.id = 9, .device = 1, .address = 0x7f0000000000ull, .size = 4096, .flags = 2};
  auto listed = agent::decode_reply(PbWriter().message(3, PbWriter().message(1, alloc).varint(2, 1)).payload());
  REQUIRE(listed.ok());
  CHECK(std::get<agent::ListAllocationsReply>(*listed).allocations == std::vector{want});
  auto held = keeper::decode_message(PbWriter().message(1, PbWriter().varint(1, 42).message(2, alloc)).payload());
  REQUIRE(held.ok());
  CHECK(std::get<keeper::Hold>(*held).allocations == std::vector{want});
}
