// The coordination store of one run of a job across hosts (phosctl job):
// its keys, and the outcome every host's criu abides by. The driver serves
// the store (outside every dumped tree: the job's own store is frozen
// inside one host's while it is dumped); each host's step, criu's action
// script and the plugin are its clients. Keys, under phos/run/<run>/:
//
//   host/<i>/ranks               a step: "JOB NRANKS RANK:CALLS..."
//   host/<i>/failed              a step, before go: why it gave up (every host then lifts)
//   abort                        the driver, before go: why the job's dump is given up
//   host/<i>/calls/<r>           a step: the most calls its ranks issued, round r
//   plan/<r>                     the driver: the call to hold at
//   host/<i>/armed/<r>           a step: "ok", or "past" (a rank got there first)
//   verdict/<r>                  the driver: "hold", or "again" (stops lifted)
//   host/<i>/ready               a step: "ok CALL" (held there, release pending) or "error: why"
//   go                           the driver: every host is ready, each step runs criu
//   host/<i>/dumped              the action script, at post-dump: "ok"
//   outcome                      "commit" or "abort: why", set once (COMPARE_SET from empty):
//                                the driver commits once every host dumped; anyone aborts
//   host/<i>/complete            a step, after criu: "ok" (images whole) or "error: why"
//   host/<i>/record              a restore step: its host's phos-job record (job_record.h)
//   host/<i>/restored            a restore step: "ok PID" or "error: why"
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "phos/support/result.h"
#include "phos/support/tcp_store_client.h"

namespace phos::plugin {

class JobKeys {
 public:
  explicit JobKeys(uint64_t run);
  std::string host(int i, const std::string& what) const;
  std::string ranks(int i) const { return host(i, "ranks"); }
  std::string calls(int i, int round) const { return host(i, "calls/" + std::to_string(round)); }
  std::string armed(int i, int round) const { return host(i, "armed/" + std::to_string(round)); }
  std::string ready(int i) const { return host(i, "ready"); }
  std::string dumped(int i) const { return host(i, "dumped"); }
  std::string complete(int i) const { return host(i, "complete"); }
  std::string restored(int i) const { return host(i, "restored"); }
  std::string failed(int i) const { return host(i, "failed"); }
  std::string record(int i) const { return host(i, "record"); }
  std::string abort() const { return prefix_ + "abort"; }
  std::string plan(int round) const { return prefix_ + "plan/" + std::to_string(round); }
  std::string verdict(int round) const { return prefix_ + "verdict/" + std::to_string(round); }
  std::string go() const { return prefix_ + "go"; }
  std::string outcome() const { return prefix_ + "outcome"; }

 private:
  std::string prefix_;
};

// "abort: why" -> why; nothing for any other value.
std::optional<std::string> aborted(const std::string& value);

struct JobOutcome {
  bool commit = false;
  std::string why;  // an abort's
};

// Proposes `proposal` ("commit" or "abort: why") as the outcome: the
// outcome that won (the first proposal, whoever made it).
Result<JobOutcome> propose_outcome(net::TcpStoreClient& store, const JobKeys& keys, const std::string& proposal);
// The outcome once decided, or ETIMEDOUT at `deadline`.
Result<JobOutcome> wait_outcome(net::TcpStoreClient& store, const JobKeys& keys, net::Deadline deadline);
// A key's value as text, waiting for it until `deadline`.
Result<std::string> wait_text(net::TcpStoreClient& store, const std::string& key, net::Deadline deadline);
// The first of `keys` to be set, as (index, text), looking every 20 ms
// until `deadline` (a WAIT waits for all of its keys, not any).
Result<std::pair<size_t, std::string>> wait_any(net::TcpStoreClient& store, const std::vector<std::string>& keys,
                                                net::Deadline deadline);
Result<void> put_text(net::TcpStoreClient& store, const std::string& key, const std::string& value);

}  // namespace phos::plugin
