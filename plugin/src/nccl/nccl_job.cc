#include "phos/plugin/nccl_job.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>

#include "phos/plugin/agent_client.h"

namespace phos::plugin {
namespace {

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof(b), "%016" PRIx64, v);
  return b;
}

Result<std::vector<agent::StatusReply>> statuses(const std::vector<pid_t>& pids, int timeout_ms) {
  std::vector<agent::StatusReply> out;
  for (pid_t p : pids) {
    std::optional<agent::StatusReply> got;
    PHOS_TRY(with_agent(p, timeout_ms, [&](AgentClient& c) -> Result<void> {
      auto s = c.status();
      if (!s) return s.error();
      got = std::move(*s);
      return {};
    }));
    out.push_back(std::move(*got));
  }
  return out;
}

// Every rank's stop armed at `at` (or lifted, without); true where each was.
Result<bool> stop_all(const std::vector<pid_t>& pids, uint64_t job, std::optional<uint64_t> at, int timeout_ms,
                      std::optional<uint32_t> lease_ms) {
  bool armed = true;
  for (pid_t p : pids)
    PHOS_TRY(with_agent(p, timeout_ms, [&](AgentClient& c) -> Result<void> {
      auto r = c.nccl_stop(job, at, lease_ms);
      if (!r) return r.error();
      armed = armed && *r;
      return {};
    }));
  return armed;
}

}  // namespace

const agent::NcclCommunicatorStatus* spanning_communicator(const agent::StatusReply& s) {
  for (const auto& c : s.nccl_communicators)
    if (c.nranks > 1 && !c.single_process) return &c;
  return nullptr;
}

const agent::NcclCommunicatorStatus* job_communicator(const agent::StatusReply& s, uint64_t job_id) {
  for (const auto& c : s.nccl_communicators)
    if (c.job_id == job_id) return &c;
  return nullptr;
}

Result<std::vector<pid_t>> find_nccl_job(const std::vector<pid_t>& candidates, uint64_t job_id, int nranks,
                                         int agent_timeout_ms, std::vector<agent::StatusReply>* statuses) {
  std::map<int, std::pair<pid_t, agent::StatusReply>> ranks;
  for (pid_t p : candidates) {
    auto client = AgentClient::connect(p, agent_timeout_ms);
    if (!client) continue;  // no agent: no rank of ours
    auto s = client->status();
    (void)client->goodbye();
    if (!s) continue;
    if (auto* c = job_communicator(*s, job_id); c && c->rank >= 0 && c->rank < nranks)
      ranks.emplace(c->rank, std::pair{p, std::move(*s)});
  }
  if (int(ranks.size()) == nranks) {
    std::vector<pid_t> out;
    for (auto& [rank, found] : ranks) {
      out.push_back(found.first);
      if (statuses) statuses->push_back(std::move(found.second));
    }
    return out;
  }
  std::string missing;
  for (int r = 0; r < nranks; r++)
    if (!ranks.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  return make_error("NCCL communicator " + hex(job_id) + ": rank(s) " + missing + " of " + std::to_string(nranks) +
                        " not found among the processes dumped (outside criu's tree, or without phos's agent)",
                    ESRCH);
}

Result<std::vector<NcclJobRanks>> nccl_jobs_among(const std::vector<pid_t>& candidates, int agent_timeout_ms) {
  std::map<uint64_t, NcclJobRanks> jobs;
  for (pid_t p : candidates) {
    auto client = AgentClient::connect(p, agent_timeout_ms);
    if (!client) continue;  // no agent: no rank of ours
    auto s = client->status();
    (void)client->goodbye();
    if (!s) return make_error("process " + std::to_string(p) + ": " + s.error().message, s.error().code);
    const auto* c = spanning_communicator(*s);
    if (!c) continue;
    NcclJobRanks& j = jobs[c->job_id];
    j.job_id = c->job_id;
    j.nranks = c->nranks;
    if (j.ranks.count(c->rank))
      return make_error("NCCL communicator " + hex(c->job_id) + ": rank " + std::to_string(c->rank) +
                            " in processes " + std::to_string(j.ranks[c->rank]) + " and " + std::to_string(p),
                        EINVAL);
    j.ranks[c->rank] = p;
    j.calls[c->rank] = c->calls;
  }
  std::vector<NcclJobRanks> out;
  for (auto& [id, j] : jobs) out.push_back(std::move(j));
  return out;
}

Result<uint64_t> furthest_call(const std::vector<pid_t>& pids, uint64_t job_id, int agent_timeout_ms) {
  auto now = statuses(pids, agent_timeout_ms);
  if (!now) return now.error();
  uint64_t furthest = 0;
  for (const auto& s : *now)
    if (auto* c = job_communicator(s, job_id)) furthest = std::max(furthest, c->calls);
  return furthest;
}

Result<bool> arm_stops(const std::vector<pid_t>& pids, uint64_t job_id, std::optional<uint64_t> at,
                       int agent_timeout_ms, std::optional<uint32_t> lease_ms) {
  return stop_all(pids, job_id, at, agent_timeout_ms, lease_ms);
}

Result<uint64_t> wait_held(const std::vector<pid_t>& pids, uint64_t job_id, uint64_t at, int agent_timeout_ms,
                           std::chrono::milliseconds wait) {
  // Every rank reaches K (the others' K-1 is issued, so none waits on a
  // held one), or the first call past it that a stop may hold (not inside
  // a group after its first): the same on every rank.
  const auto until = std::chrono::steady_clock::now() + wait;
  for (;;) {
    auto now = statuses(pids, agent_timeout_ms);
    if (!now) return now.error();
    bool all = true;
    std::optional<uint64_t> held_at;
    for (const auto& s : *now) {
      auto* c = job_communicator(s, job_id);
      all = all && c && c->held && c->calls >= at && (!held_at || *held_at == c->calls);
      if (c) held_at = c->calls;
    }
    if (all && held_at) return *held_at;
    if (std::chrono::steady_clock::now() >= until)
      return make_error("not every rank of NCCL communicator " + hex(job_id) + " reached call " +
                            std::to_string(at) + " in " + std::to_string(wait.count()) + " ms",
                        ETIMEDOUT);
    ::usleep(20000);
  }
}

Result<void> pend_releases(const std::vector<pid_t>& pids, uint64_t job_id, int agent_timeout_ms) {
  for (pid_t p : pids)
    if (auto r = with_agent(p, agent_timeout_ms, [&](AgentClient& c) { return c.nccl_pend_release(job_id, true); }); !r)
      return make_error("process " + std::to_string(p) + ": " + r.error().message, r.error().code);
  // Held, every rank's dump must be able to go through: what one rank
  // cannot take refuses the whole job before any rank lets go of its
  // communicators.
  auto now = statuses(pids, agent_timeout_ms);
  if (!now) return now.error();
  for (size_t i = 0; i < pids.size(); i++)
    if (!(*now)[i].unsupported_calls.empty()) {
      std::string why;
      for (const auto& u : (*now)[i].unsupported_calls) why += (why.empty() ? "" : ", ") + u;
      const auto* c = job_communicator((*now)[i], job_id);
      return make_error("rank " + std::to_string(c ? c->rank : int(i)) + " (process " + std::to_string(pids[i]) +
                            ") used " + why + ", which phos cannot checkpoint; the whole job goes on",
                        ENOTSUP);
    }
  return {};
}

Result<NcclJobHeld> hold_nccl_job(const std::vector<pid_t>& pids, uint64_t job_id, int agent_timeout_ms,
                                  std::chrono::milliseconds wait, bool pend_release) {
  NcclJobHeld held{job_id, 0, pids};
  auto give_up = [&](const Error& e) -> Result<NcclJobHeld> {
    (void)let_nccl_job_go(held, agent_timeout_ms);
    return e;
  };
  bool armed = false;
  for (int round = 0; round < kHoldRounds && !armed; round++) {
    auto furthest = furthest_call(pids, job_id, agent_timeout_ms);
    if (!furthest) return give_up(furthest.error());
    held.at_call = *furthest + hold_margin(round);
    auto r = arm_stops(pids, job_id, held.at_call, agent_timeout_ms);
    if (!r) return give_up(r.error());
    armed = *r;
    if (!armed) {
      auto lifted = arm_stops(pids, job_id, std::nullopt, agent_timeout_ms);  // a rank was past it: again further on
      if (!lifted) return give_up(lifted.error());
    }
  }
  if (!armed) return give_up(make_error("the ranks of NCCL communicator " + hex(job_id) + " ran past every stop tried", EAGAIN));
  auto at = wait_held(pids, job_id, held.at_call, agent_timeout_ms, wait);
  if (!at) return give_up(at.error());
  held.at_call = *at;
  if (!pend_release) return held;
  if (auto r = pend_releases(pids, job_id, agent_timeout_ms); !r) return give_up(r.error());
  return held;
}

std::vector<std::string> let_nccl_job_go(const NcclJobHeld& held, int agent_timeout_ms) {
  std::vector<std::string> failed;
  for (pid_t p : held.pids) {
    auto r = with_agent(p, agent_timeout_ms, [&](AgentClient& c) -> Result<void> {
      (void)c.nccl_pend_release(held.job_id, false);  // "not pending": nothing to lift
      auto lifted = c.nccl_stop(held.job_id, std::nullopt);
      if (!lifted) return lifted.error();
      return {};
    });
    if (!r) failed.push_back("process " + std::to_string(p) + ": " + r.error().message);
  }
  return failed;
}

}  // namespace phos::plugin
