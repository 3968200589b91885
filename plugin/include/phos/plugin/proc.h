// What the plugin reads about a target process from /proc.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "phos/support/result.h"

namespace phos::plugin {

// The pid of `pid` in its own (innermost) pid namespace: NSpid's last field.
Result<pid_t> ns_pid(pid_t pid);

// The thread of `pid` whose name (comm) is `name`.
Result<pid_t> find_thread(pid_t pid, const std::string& name);

// The state letter of thread `tid` of `pid` ('R', 'S', 't' in a tracing
// stop, ...); 0 where it is gone.
char thread_state(pid_t pid, pid_t tid);
// The name (comm) of thread `tid` of `pid`; empty where it is gone.
std::string thread_name(pid_t pid, pid_t tid);

// The threads of `pid` (/proc/PID/task); none where it is gone.
std::vector<pid_t> thread_ids(pid_t pid);

// Every thread of this process (criu's) takes at least nice `nice` (one
// whose nice is higher already keeps it); threads made later inherit it
// from their maker. How many were changed.
Result<size_t> lower_own_priority(int nice);

// This process's (criu's) descriptor table grown now to hold descriptors
// up to `fds` - 1 (bounded by RLIMIT_NOFILE); the kernel never shrinks it.
// Each growth of a table that threads share waits for an RCU grace period
// (10-30 ms); a dump's page pipes, two descriptors for every 1 MiB of a
// process's pages, grew criu's table twice inside the stall of the 8B
// server's dump. The table's size after (/proc/self/status FDSize).
Result<size_t> reserve_fd_table(int fds);

// The size, in bytes, that fs.pipe-max-size holds this process's pipes to:
// none where the process has CAP_SYS_RESOURCE, which lifts that bound.
// criu's page pipes grow to 3.2 MiB by themselves; held to the kernel's
// default 1 MiB, criu's copy of a process's CPU pages takes up to four
// times the round trips to the frozen process (docs/benchmarks/criu-pages.md).
std::optional<size_t> pipe_size_bound();

// The ptrace tracer of thread `tid` of process `pid` (0: none).
Result<pid_t> tracer_of(pid_t pid, pid_t tid);

// Whether a file whose name contains `name` is mapped in `pid` (a loaded
// shared library, for messages).
bool maps_library(pid_t pid, const std::string& name);

// True while `pid` exists and is not a zombie.
bool process_alive(pid_t pid);
// Waits, `limit_ms` at most, until `pid` is free (/proc/PID gone: exited and
// reaped, so that criu can restore a process with that pid); how long it
// took in ms (limit_ms: still taken). `exited_ms`: when it was first seen
// exited (a zombie), limit_ms where it never was.
int wait_pid_free(pid_t pid, int limit_ms, int* exited_ms = nullptr);
// The children of every thread of `pid` (/proc/PID/task/TID/children); none
// where it is gone.
std::vector<pid_t> children_of(pid_t pid);
// When `pid` started, in clock ticks since boot (/proc/PID/stat field 22):
// tells a process from a later one that got its pid.
std::optional<uint64_t> start_time_of(pid_t pid);
// The resident memory of `pid` in bytes (/proc/PID/status VmRSS); nothing
// where it is gone or has none.
std::optional<uint64_t> resident_bytes(pid_t pid);
// True when `pid` has a SIGKILL pending (it is being killed, and may not have
// exited yet), or is gone.
bool kill_pending(pid_t pid);

// The abstract name (no leading NUL) of the listening unix socket of `pid`
// whose name starts with `prefix`, or nothing when it has none.
Result<std::optional<std::string>> find_listening_socket(pid_t pid, const std::string& prefix);

// Whether a criu command line (argv, program name first) asks for a dump
// that leaves the processes running: `dump` with -R, --leave-running or an
// unambiguous abbreviation of it. false where the line does not say so, such
// as `criu swrk` (its options come over RPC) or an option in a config file:
// callers treat "don't know" as "the processes end".
bool argv_leaves_running(const std::vector<std::string>& argv);

// The same for this process (/proc/self/cmdline): the criu that loaded the
// plugin.
bool criu_leaves_running();
// Whether criu's command line is a restore with --lazy-pages (CPU pages on
// demand): GPU memory is then restored on demand too (lazy_restore=auto).
bool argv_restores_lazily(const std::vector<std::string>& argv);
bool criu_restores_lazily();
// The parent image directory a criu dump names (--prev-images-dir DIR or
// =DIR, relative to the image directory as criu resolves it), or none.
std::optional<std::string> argv_prev_images_dir(const std::vector<std::string>& argv);
std::optional<std::string> criu_prev_images_dir();
// The root of the tree a criu command line dumps (-t/--tree PID), or none
// where it names none (criu swrk: its options come over RPC).
std::optional<pid_t> argv_tree_root(const std::vector<std::string>& argv);
// The processes of this criu's dumped tree: its root and every descendant,
// root first; none where the root is unknown.
std::vector<pid_t> criu_tree_pids();
// `root` and every descendant, root first.
std::vector<pid_t> tree_pids(pid_t root);

// This process's open descriptors whose /proc/self/fd link starts with
// `prefix` ("/dev/nvidia": the CUDA driver's files), in ascending order;
// `all` (where given) gets every open descriptor.
std::vector<int> open_files_named(const std::string& prefix, std::vector<int>* all = nullptr);
// At this process's exit (atexit; not in a child that exits through
// exit()), the files named `prefix` go to a child forked then, which keeps
// them, and nothing else, until this process has gone, then closes them.
// A process with CUDA state waits at its exit for the driver to tear it
// down as its files close: criu with its contexts and staging 88-141 ms,
// 0.2 ms with the child (an H200): the teardown is the child's, after
// criu's caller has its exit status. Once per process.
void hold_files_at_exit(const std::string& prefix);
// What the handler does, now: the child's pid once it holds them; 0 where
// no file is named `prefix`, -1 where the fork failed.
pid_t hand_files_to_holder(const std::string& prefix);

}  // namespace phos::plugin
