#include "phos/plugin/job_store.h"
#include "phos/support/text.h"

#include <thread>

#include "phos/plugin/job_env.h"
#include "phos/support/tcp_store_protocol.h"

namespace phos::plugin {

JobKeys::JobKeys(uint64_t run) : prefix_("phos/run/" + run_hex(run) + "/") {}

std::string JobKeys::host(int i, const std::string& what) const {
  return prefix_ + "host/" + std::to_string(i) + "/" + what;
}

std::optional<std::string> aborted(const std::string& value) {
  static const std::string kAbort = "abort: ";
  if (value.rfind(kAbort, 0) != 0) return std::nullopt;
  return value.substr(kAbort.size());
}

namespace {
Result<JobOutcome> outcome_of(const std::string& value) {
  if (value == "commit") return JobOutcome{true, {}};
  if (auto why = aborted(value)) return JobOutcome{false, *why};
  return make_error("the job's outcome is '" + value + "', neither commit nor abort", EPROTO);
}
}  // namespace

Result<JobOutcome> propose_outcome(net::TcpStoreClient& store, const JobKeys& keys, const std::string& proposal) {
  auto won = store.compare_set(keys.outcome(), {}, net::bytes_of(proposal));
  if (!won) return won.error();
  return outcome_of(net::text_of(*won));
}

Result<std::string> wait_text(net::TcpStoreClient& store, const std::string& key, net::Deadline deadline) {
  auto v = store.get(key, deadline);
  if (!v) return v.error();
  return net::text_of(*v);
}

Result<std::pair<size_t, std::string>> wait_any(net::TcpStoreClient& store, const std::vector<std::string>& keys,
                                                net::Deadline deadline) {
  for (;;) {
    for (size_t i = 0; i < keys.size(); i++) {
      auto there = store.check({keys[i]});
      if (!there) return there.error();
      if (!*there) continue;
      auto v = wait_text(store, keys[i], net::deadline_in(net::TcpStoreClient::kReplyTimeout));
      if (!v) return v.error();
      return std::make_pair(i, *v);
    }
    if (net::Clock::now() >= deadline) {
      std::string names;
      for (const auto& k : keys) append_item(names, " or ", k);
      return make_error("nothing set at " + names + " before the deadline", ETIMEDOUT);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Result<void> put_text(net::TcpStoreClient& store, const std::string& key, const std::string& value) {
  return store.set(key, net::bytes_of(value));
}

Result<JobOutcome> wait_outcome(net::TcpStoreClient& store, const JobKeys& keys, net::Deadline deadline) {
  auto v = wait_text(store, keys.outcome(), deadline);
  if (!v) return v.error();
  return outcome_of(*v);
}

}  // namespace phos::plugin
