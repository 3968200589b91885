// The lease on a job-wide NCCL stop: its rules (stop_lease.h), and the agent
// that lifts a stop whose holder stopped renewing it, unless a quiesce took
// it over, with the step's renewer (stop_renewer.h) keeping it.
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <mutex>
#include <thread>

#include "phos/hooks/agent.h"
#include "phos/hooks/stop_lease.h"
#include "phos/plugin/agent_client.h"
#include "phos/plugin/stop_renewer.h"

using namespace phos;
using namespace phos::hooks;
using phos::plugin::AgentClient;
using phos::plugin::StopRenewer;
using namespace std::chrono_literals;

namespace {

using Clock = StopLease::Clock;

// What the agent asked of NCCL: each stop armed or lifted, each pending
// release set or lifted.
class StopBackend : public AgentBackend {
 public:
  agent::StatusReply status() override { return {}; }
  std::vector<agent::Allocation> allocations() override { return {}; }
  Result<UniqueFd> export_allocation(uint64_t) override { return make_error("none", ENOENT); }
  Result<void> drain(std::chrono::milliseconds) override { return {}; }
  Result<uint64_t> release_mappings(bool) override { return uint64_t(0); }
  Result<uint64_t> remap(std::span<const uint64_t>, std::vector<UniqueFd>) override { return uint64_t(0); }
  Result<void> set_speculation(bool) override { return {}; }
  Result<bool> set_validation(bool) override { return false; }
  Result<bool> nccl_stop(uint64_t job_id, std::optional<uint64_t> at_call) override {
    std::lock_guard<std::mutex> lock(mu);
    (at_call ? arms : lifts).push_back(job_id);
    return at_call.has_value();
  }
  Result<bool> nccl_pend_release(bool pend) override {
    std::lock_guard<std::mutex> lock(mu);
    if (!pend) pending_lifts++;
    return true;
  }
  size_t lifted() {
    std::lock_guard<std::mutex> lock(mu);
    return lifts.size();
  }
  size_t armed() {
    std::lock_guard<std::mutex> lock(mu);
    return arms.size();
  }
  std::mutex mu;
  std::vector<uint64_t> arms, lifts;
  int pending_lifts = 0;
};

struct LeasedAgent {
  Gate gate;
  StopBackend backend;
  Agent agent{gate, backend};
  LeasedAgent() { REQUIRE(agent.start().ok()); }
  AgentClient client() {
    auto c = AgentClient::connect(::getpid(), 2000);
    REQUIRE(c.ok());
    return std::move(c.value());
  }
  void arm(uint64_t job, std::optional<uint32_t> lease_ms) {
    auto c = client();
    auto r = c.nccl_stop(job, 40, lease_ms);
    REQUIRE(r.ok());
    CHECK(*r);
    CHECK(c.goodbye().ok());
  }
  // True once the backend saw `n` lifts, within `wait`.
  bool lifted_within(size_t n, std::chrono::milliseconds wait) {
    const auto until = Clock::now() + wait;
    while (Clock::now() < until) {
      if (backend.lifted() >= n) return true;
      std::this_thread::sleep_for(5ms);
    }
    return backend.lifted() >= n;
  }
};

}  // namespace

TEST_CASE("stop lease: runs out at its deadline, not before", "[stop_lease]") {
  StopLease l;
  const auto t0 = Clock::now();
  CHECK_FALSE(l.left(t0));
  CHECK_FALSE(l.expired(t0 + 1h));
  l.grant(7, 100ms, t0);
  CHECK(l.length() == 100ms);
  CHECK(l.left(t0) == 100ms);
  CHECK(l.left(t0 + 99ms) == 1ms);
  CHECK_FALSE(l.expired(t0 + 99ms));
  CHECK(l.expired(t0 + 100ms) == 7u);
  // Once run out it is over: the stop is lifted once.
  CHECK_FALSE(l.expired(t0 + 200ms));
  CHECK_FALSE(l.left(t0 + 200ms));
  CHECK(l.length() == 0ms);
}

TEST_CASE("stop lease: a renewal moves the deadline", "[stop_lease]") {
  StopLease l;
  const auto t0 = Clock::now();
  l.grant(7, 100ms, t0);
  l.grant(7, 100ms, t0 + 80ms);
  CHECK_FALSE(l.expired(t0 + 150ms));
  CHECK(l.left(t0 + 150ms) == 30ms);
  CHECK(l.expired(t0 + 180ms) == 7u);
}

TEST_CASE("stop lease: a quiesce takes it over, and it never runs out", "[stop_lease]") {
  StopLease l;
  const auto t0 = Clock::now();
  l.grant(7, 100ms, t0);
  CHECK(l.take_over() == 7u);
  CHECK_FALSE(l.expired(t0 + 1h));
  CHECK_FALSE(l.left(t0));
  CHECK_FALSE(l.take_over());  // nothing ran
}

TEST_CASE("stop lease: lifted or armed without a lease by its holder, none runs; another job's lift leaves it",
          "[stop_lease]") {
  StopLease l;
  const auto t0 = Clock::now();
  l.grant(7, 100ms, t0);
  l.clear(8);
  CHECK(l.left(t0) == 100ms);
  l.clear(7);
  CHECK_FALSE(l.expired(t0 + 1h));
  // A grant for another job replaces the lease: one stop holds one job.
  l.grant(7, 100ms, t0);
  l.grant(9, 50ms, t0);
  CHECK(l.expired(t0 + 50ms) == 9u);
  CHECK_FALSE(l.expired(t0 + 1h));
}

TEST_CASE("stop renewer: renews every quarter of the lease, at least every 10 ms", "[stop_lease]") {
  CHECK(StopRenewer::interval(10000ms) == 2500ms);
  CHECK(StopRenewer::interval(20ms) == 10ms);
}

TEST_CASE("agent: a leased stop not renewed is lifted, with its pending release", "[stop_lease][agent]") {
  LeasedAgent a;
  const auto t0 = Clock::now();
  a.arm(0xabc, 150);
  REQUIRE(a.lifted_within(1, 2000ms));
  const auto took = Clock::now() - t0;
  CHECK(took >= 150ms);
  CHECK(took < 1500ms);
  std::lock_guard<std::mutex> lock(a.backend.mu);
  CHECK(a.backend.lifts == std::vector<uint64_t>{0xabc});
  CHECK(a.backend.pending_lifts == 1);
}

TEST_CASE("agent: a stop without a lease stays armed (phosctl nccl-stop, nccl-quiesce)", "[stop_lease][agent]") {
  LeasedAgent a;
  a.arm(0xabc, std::nullopt);
  CHECK_FALSE(a.lifted_within(1, 400ms));
  // Armed again without a lease after one with: the holder wants none.
  a.arm(0xabc, 500);
  a.arm(0xabc, std::nullopt);
  CHECK_FALSE(a.lifted_within(1, 1000ms));
}

TEST_CASE("agent: a quiesce takes a leased stop over; it is not lifted past the lease", "[stop_lease][agent]") {
  LeasedAgent a;
  a.arm(0xabc, 500);
  {
    auto c = a.client();
    REQUIRE(c.quiesce(1000).ok());
    CHECK(c.goodbye().ok());
  }
  CHECK_FALSE(a.lifted_within(1, 1000ms));
  CHECK_FALSE(a.gate.is_open());
}

TEST_CASE("agent: a leased stop lifted by its holder is lifted once", "[stop_lease][agent]") {
  LeasedAgent a;
  a.arm(0xabc, 500);
  {
    auto c = a.client();
    REQUIRE(c.nccl_stop(0xabc, std::nullopt).ok());
    CHECK(c.goodbye().ok());
  }
  REQUIRE(a.lifted_within(1, 100ms));
  CHECK_FALSE(a.lifted_within(2, 1000ms));
  CHECK(a.backend.pending_lifts == 0);
}

TEST_CASE("stop renewer: keeps a leased stop armed while it renews; lifted a lease after it stops",
          "[stop_lease][agent]") {
  LeasedAgent a;
  std::vector<std::string> said;
  std::mutex said_mu;
  StopRenewer r({::getpid()}, 0xabc, 200ms, 2000, [&](const std::string& s) {
    std::lock_guard<std::mutex> lock(said_mu);
    said.push_back(s);
  });
  a.arm(0xabc, r.lease_ms());
  r.renew_at(40);
  CHECK_FALSE(a.lifted_within(1, 800ms));  // four leases
  CHECK(r.renewals() >= 3);
  r.stop();
  const size_t arms = a.backend.armed();
  REQUIRE(r.finish(0ms).ok());  // one last renewal (of a lease at least), then none
  CHECK(a.backend.armed() == arms + 1);
  const auto stopped = Clock::now();
  REQUIRE(a.lifted_within(1, 2000ms));
  CHECK(Clock::now() - stopped >= 150ms);
  CHECK(a.backend.armed() == arms + 1);
  std::lock_guard<std::mutex> lock(said_mu);
  CHECK(said.empty());
}

TEST_CASE("stop renewer: the last renewal leases the stop for what it is given (the job's timeout), not one lease",
          "[stop_lease][agent]") {
  LeasedAgent a;
  StopRenewer r({::getpid()}, 0xabc, 200ms, 2000, [](const std::string&) {});
  a.arm(0xabc, r.lease_ms());
  r.renew_at(40);
  std::this_thread::sleep_for(100ms);
  const auto finished = Clock::now();
  REQUIRE(r.finish(1500ms).ok());
  // criu's pauses of many ranks may take several leases: the stop holds.
  CHECK_FALSE(a.lifted_within(1, 1000ms));
  REQUIRE(a.lifted_within(1, 2000ms));  // the holder gone, it runs out all the same
  CHECK(Clock::now() - finished >= 1400ms);
}

TEST_CASE("stop renewer: renews nothing once told the stops are lifted", "[stop_lease][agent]") {
  LeasedAgent a;
  StopRenewer r({::getpid()}, 0xabc, 100ms, 2000, [](const std::string&) {});
  a.arm(0xabc, r.lease_ms());
  r.renew_at(40);
  std::this_thread::sleep_for(100ms);
  r.renew_at(std::nullopt);
  const size_t arms = a.backend.armed();
  REQUIRE(a.lifted_within(1, 1000ms));  // its lease ran out: nothing renewed it
  std::this_thread::sleep_for(100ms);
  CHECK(a.backend.armed() == arms);
}

TEST_CASE("stop renewer: says once that a rank's agent cannot be reached", "[stop_lease]") {
  std::vector<std::string> said;
  std::mutex said_mu;
  {
    // A pid with no agent (this process runs none here).
    StopRenewer r({::getpid()}, 0xabc, 40ms, 200, [&](const std::string& s) {
      std::lock_guard<std::mutex> lock(said_mu);
      said.push_back(s);
    });
    r.renew_at(40);
    std::this_thread::sleep_for(150ms);
    CHECK_FALSE(r.finish(0ms).ok());
  }
  std::lock_guard<std::mutex> lock(said_mu);
  REQUIRE(said.size() == 1);
  CHECK_THAT(said[0], Catch::Contains("renewing the stops' lease"));
}
