// The agent: a thread inside the application that answers the CRIU plugin
// (and phosctl) on an abstract unix socket named phos-agent.<pid>.<nonce>.
// Only root or the process's own uid may talk to it (SO_PEERCRED).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "phos/hooks/agent_backend.h"
#include "phos/hooks/gate.h"
#include "phos/hooks/step_boundary.h"
#include "phos/hooks/stop_lease.h"
#include "phos/images/agent_protocol.h"
#include "phos/images/unique_fd.h"
#include "phos/support/result.h"

namespace phos::hooks {

struct AgentOptions {
  int idle_timeout_ms = 30000;  // a silent client is dropped after this long
  // The program's iteration boundaries (step_boundary.h), where it marks
  // them: a quiesce waits at most step_wait_ms for the next one.
  StepBoundary* steps = nullptr;
  int step_wait_ms = 2000;
};

// This process's agent's socket name ("" before one started): the IPC
// handles the process serves name it (ipc_handle.h).
std::string own_agent_socket_name();

class Agent {
 public:
  Agent(Gate& gate, AgentBackend& backend, AgentOptions options = {});
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  Result<void> start();
  // Stops the thread and closes the socket.
  void stop();
  // After fork(), in the child: the parent's socket is not ours; close it and
  // start a fresh agent (new pid, new name). Only close() before the restart.
  Result<void> restart_after_fork();

  const std::string& socket_name() const { return name_; }  // without the leading NUL
  pid_t thread_id() const { return tid_.load(); }

 private:
  void run(std::promise<void>& named);
  void serve(int conn);
  bool peer_allowed(int conn);
  // Handles one request; false ends the connection (after the reply).
  bool handle(int conn, agent::ReceivedRequest& req, bool& greeted);

  // What the agent answers to one request.
  struct Answer {
    Answer(agent::Reply r, bool hang_up_after = false) : reply(std::move(r)), hang_up(hang_up_after) {}
    agent::Reply reply;
    std::vector<UniqueFd> fds;  // go with the reply
    bool hang_up = false;       // close the connection after the reply
  };
  // An error reply; the session goes on.
  static Answer failure(int code, const std::string& message);
  std::string rebuilt_after_failure();
  Answer answer(const agent::Hello& q);
  Answer answer(const agent::StatusRequest& q);
  Answer answer(const agent::ListAllocationsRequest& q);
  Answer answer(const agent::QuiesceRequest& q);
  Answer answer(const agent::ReleaseMappingsRequest& q);
  Answer answer(const agent::RemapRequest& q, std::vector<UniqueFd> fds);
  Answer answer(const agent::ResumeRequest& q);
  Answer answer(const agent::GoodbyeRequest& q);
  Answer answer(const agent::SpeculateRequest& q);
  Answer answer(const agent::OpenCopyWindowRequest& q, std::vector<UniqueFd> fds);
  Answer answer(const agent::CloseCopyWindowRequest& q);
  Answer answer(const agent::NcclStopRequest& q);
  Answer answer(const agent::IpcOpenRequest& q, pid_t peer);
  Answer answer(const agent::IpcCloseRequest& q, pid_t peer);
  // The NCCL stop whose lease ran out (its holder is gone) lifted, with a
  // release pending that released nothing; said on stderr.
  void lift_lapsed_stop();
  // How long run() may sleep in poll(): until the stop's lease runs out.
  int poll_timeout_ms() const;

  Gate& gate_;
  AgentBackend& backend_;
  AgentOptions options_;
  std::string name_;
  UniqueFd listen_fd_;
  UniqueFd stop_fd_;  // eventfd that wakes run() for stop()
  std::atomic<int> conn_fd_{-1};
  std::atomic<pid_t> tid_{0};
  std::thread thread_;
  // A dump's engine found a copy that differs from the freeze (a write
  // speculation missed): every later dump copies while the process is
  // stopped. Kept for the process's life (a restore brings it back with
  // the rest of its memory). Only the agent's thread touches it.
  bool cow_missed_ = false;
  // The lease on a job-wide NCCL stop (stop_lease.h). Only the agent's
  // thread touches it.
  StopLease lease_;
};

}  // namespace phos::hooks
