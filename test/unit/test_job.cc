// A job across hosts (phosctl job): PHOS_JOB, each host's record of a
// checkpoint and the checks on a set of them, the coordination store's
// outcome, and the commands the driver runs.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "phos/images/unique_fd.h"
#include "phos/plugin/job_command.h"
#include "phos/plugin/job_env.h"
#include "phos/plugin/job_record.h"
#include "phos/plugin/job_store.h"
#include "phos/support/tcp_store_server.h"

using namespace phos::plugin;
using namespace std::chrono_literals;

namespace {

JobRecord record(int host, std::vector<int> ranks) {
  return JobRecord{0x1234, host, 2, 0xabc, 2, 40, std::move(ranks)};
}

phos::UniqueFd temp_dir() {
  char pattern[] = "/tmp/phos-job-XXXXXX";
  REQUIRE(::mkdtemp(pattern) != nullptr);
  return phos::UniqueFd(::open(pattern, O_DIRECTORY | O_RDONLY | O_CLOEXEC));
}

}  // namespace

TEST_CASE("job env: PHOS_JOB names the run, the host, the hosts and the coordinator", "[job]") {
  auto j = parse_job_run("00000000000000ff:1/2@10.77.0.1:4000");
  REQUIRE(j.ok());
  REQUIRE(j->has_value());
  CHECK((*j)->run == 0xff);
  CHECK((*j)->host == 1);
  CHECK((*j)->hosts == 2);
  CHECK((*j)->coordinator.text() == "10.77.0.1:4000");
  CHECK((*j)->text() == "00000000000000ff:1/2@10.77.0.1:4000");
}

TEST_CASE("job env: none set is no job", "[job]") {
  auto j = parse_job_run(nullptr);
  REQUIRE(j.ok());
  CHECK_FALSE(j->has_value());
  CHECK_FALSE(parse_job_run("")->has_value());
}

TEST_CASE("job env: a malformed PHOS_JOB is an error saying what is wrong", "[job]") {
  CHECK(parse_job_run("ff:1/2").error().message.find("not of the form") != std::string::npos);
  CHECK(parse_job_run("zz:0/2@h:1").error().message.find("not a run") != std::string::npos);
  CHECK(parse_job_run("0:0/2@h:1").error().message.find("not a run") != std::string::npos);
  CHECK(parse_job_run("ff:2/2@h:1").error().message.find("not below the host count") != std::string::npos);
  CHECK(parse_job_run("ff:x/2@h:1").error().message.find("host index 'x'") != std::string::npos);
  CHECK(parse_job_run("ff:0/0@h:1").error().message.find("host count") != std::string::npos);
  CHECK(parse_job_run("ff:0/2@h").error().message.find("HOST:PORT") != std::string::npos);
}

TEST_CASE("job record: written and read back alike", "[job]") {
  JobRecord r = record(1, {1, 3});
  r.nranks = 4;
  auto back = parse_job_record(format_job_record(r));
  REQUIRE(back.ok());
  CHECK(*back == r);
}

TEST_CASE("job record: a missing or bad field is named", "[job]") {
  std::string text = format_job_record(record(0, {0}));
  CHECK(parse_job_record(text.substr(0, text.find("\nranks =") + 1)).error().message.find("no ranks") != std::string::npos);
  std::string bad_host = text;
  bad_host.replace(bad_host.find("host = 0"), 8, "host = 5");
  CHECK(parse_job_record(bad_host).error().message.find("host = '5' is not 0..1") != std::string::npos);
  std::string bad_rank = text;
  bad_rank.replace(bad_rank.find("ranks = 0"), 9, "ranks = 7");
  CHECK(parse_job_record(bad_rank).error().message.find("ranks = '7'") != std::string::npos);
  CHECK(parse_job_record("run 12\n").error().message.find("line 1: no '='") != std::string::npos);
}

TEST_CASE("job records: every host of one checkpoint, every rank once, pass", "[job]") {
  CHECK(check_job_records({record(0, {0}), record(1, {1})}, 2).ok());
}

TEST_CASE("job records: two dump runs are not one checkpoint", "[job]") {
  JobRecord other = record(1, {1});
  other.run = 0x99;
  auto r = check_job_records({record(0, {0}), other}, 2);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("not one checkpoint") != std::string::npos);
}

TEST_CASE("job records: a host missing, a host twice, a rank twice or missing are refused", "[job]") {
  CHECK(check_job_records({record(0, {0, 1})}, 2).error().message.find("1 hosts' records for 2") != std::string::npos);
  CHECK(check_job_records({record(0, {0}), record(0, {1})}, 2).error().message.find("comes twice") != std::string::npos);
  CHECK(check_job_records({record(0, {0}), record(1, {0})}, 2).error().message.find("rank 0 is on two hosts") !=
        std::string::npos);
  JobRecord three = record(1, {1});
  three.nranks = 3;
  CHECK(check_job_records({record(0, {0}), three}, 2).error().message.find("another communicator") != std::string::npos);
}

TEST_CASE("job records: another held call is another checkpoint", "[job]") {
  JobRecord later = record(1, {1});
  later.at_call = 41;
  CHECK_FALSE(check_job_records({record(0, {0}), later}, 2).ok());
}

TEST_CASE("job restore check: a host's image alone is refused, pointing at phosctl job restore", "[job]") {
  auto dir = temp_dir();
  REQUIRE(write_job_record(dir.get(), record(1, {1})).ok());
  auto r = check_restore_of_job(dir.get(), std::nullopt);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("restore it with phosctl job restore") != std::string::npos);
}

TEST_CASE("job restore check: under PHOS_JOB, only as the host it was dumped as", "[job]") {
  auto dir = temp_dir();
  REQUIRE(write_job_record(dir.get(), record(1, {1})).ok());
  JobRun as1{7, 1, 2, {"h", 1}}, as0{7, 0, 2, {"h", 1}};
  CHECK(check_restore_of_job(dir.get(), as1).ok());
  CHECK(check_restore_of_job(dir.get(), as0).error().message.find("the image is host 1 of 2") != std::string::npos);
}

TEST_CASE("job restore check: an image of one host needs no PHOS_JOB, and refuses one", "[job]") {
  auto dir = temp_dir();
  CHECK(check_restore_of_job(dir.get(), std::nullopt).ok());
  auto r = check_restore_of_job(dir.get(), JobRun{7, 0, 2, {"h", 1}});
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("no phos-job record") != std::string::npos);
}

TEST_CASE("job store: the first outcome proposed wins for everyone", "[job]") {
  auto server = phos::net::TcpStoreServer::start("127.0.0.1", 0);
  REQUIRE(server.ok());
  auto a = phos::net::TcpStoreClient::connect("127.0.0.1", (*server)->port(), phos::net::deadline_in(5s));
  auto b = phos::net::TcpStoreClient::connect("127.0.0.1", (*server)->port(), phos::net::deadline_in(5s));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const JobKeys keys(0x42);
  auto first = propose_outcome(*a, keys, "abort: host 1: its criu failed");
  REQUIRE(first.ok());
  CHECK_FALSE(first->commit);
  auto second = propose_outcome(*b, keys, "commit");
  REQUIRE(second.ok());
  CHECK_FALSE(second->commit);
  CHECK(second->why == "host 1: its criu failed");
  auto seen = wait_outcome(*b, keys, phos::net::deadline_in(1s));
  REQUIRE(seen.ok());
  CHECK(seen->why == "host 1: its criu failed");
}

TEST_CASE("job store: waiting for the first of several keys", "[job]") {
  auto server = phos::net::TcpStoreServer::start("127.0.0.1", 0);
  REQUIRE(server.ok());
  auto c = phos::net::TcpStoreClient::connect("127.0.0.1", (*server)->port(), phos::net::deadline_in(5s));
  REQUIRE(c.ok());
  const JobKeys keys(0x42);
  REQUIRE(put_text(*c, keys.abort(), "host 0: gone").ok());
  auto got = wait_any(*c, {keys.go(), keys.abort()}, phos::net::deadline_in(1s));
  REQUIRE(got.ok());
  CHECK(got->first == 1);
  CHECK(got->second == "host 0: gone");
  auto none = wait_any(*c, {keys.ready(0)}, phos::net::deadline_in(50ms));
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().code == ETIMEDOUT);
}

TEST_CASE("job store: keys live under the run", "[job]") {
  const JobKeys keys(0x42);
  CHECK(keys.armed(1, 3) == "phos/run/0000000000000042/host/1/armed/3");
  CHECK(keys.outcome() == "phos/run/0000000000000042/outcome");
  CHECK(aborted("abort: why") == std::optional<std::string>("why"));
  CHECK_FALSE(aborted("commit").has_value());
}

TEST_CASE("job command: words quoted for the shell, templates expanded", "[job]") {
  CHECK(shell_quote("/usr/bin/phosctl") == "/usr/bin/phosctl");
  CHECK(shell_quote("a b") == "'a b'");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  CHECK(shell_quote("") == "''");
  CHECK(shell_line({"criu", "dump", "-o", "x y"}) == "criu dump -o 'x y'");
  CHECK(expand_template("ssh node{i} {cmd}", 3, "phosctl job") == "ssh node3 phosctl job");
  CHECK(expand_template("/img/h{i}", 0, "") == "/img/h0");
}

TEST_CASE("job command: a command's exit status comes back; one that cannot start is an error", "[job]") {
  auto ok = run_command({"sh", "-c", "exit 3"}, {});
  REQUIRE(ok.ok());
  CHECK(*ok == 3);
  auto env = run_command({"sh", "-c", "test \"$PHOS_TEST_X\" = y"}, {"PHOS_TEST_X=y"});
  REQUIRE(env.ok());
  CHECK(*env == 0);
  auto none = run_command({"/nonexistent/phos-nothing"}, {});
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().message.find("cannot run /nonexistent/phos-nothing") != std::string::npos);
}

TEST_CASE("job command: criu's pid file read back; one that names no process is an error saying so", "[job]") {
  char pattern[] = "/tmp/phos-pidfile-XXXXXX";
  REQUIRE(::mkdtemp(pattern) != nullptr);
  const std::string dir = pattern;
  auto write = [&](const std::string& name, const std::string& text) {
    phos::UniqueFd fd(::open((dir + "/" + name).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    REQUIRE(fd.valid());
    REQUIRE(::write(fd.get(), text.data(), text.size()) == ssize_t(text.size()));
  };
  write("good.pid", "4242\n");
  write("bad.pid", "42x\n");
  write("zero.pid", "0");
  auto good = read_pid_file(dir, "good.pid");
  REQUIRE(good.ok());
  CHECK(*good == 4242);
  auto bad = read_pid_file(dir, "bad.pid");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("bad.pid names no process") != std::string::npos);
  CHECK_FALSE(read_pid_file(dir, "zero.pid").ok());
  auto missing = read_pid_file(dir, "none.pid");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message.find("none.pid") != std::string::npos);
  for (const char* f : {"good.pid", "bad.pid", "zero.pid"}) ::unlink((dir + "/" + f).c_str());
  ::rmdir(dir.c_str());
}
