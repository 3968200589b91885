// Periodic checkpoints (periodic.h): Young/Daly's interval, durations, and
// which images of a series go.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>

#include "fixtures.h"
#include "phos/plugin/periodic.h"

using namespace phos::plugin;

TEST_CASE("young_daly: Young's sqrt(2CM) and Daly's correction, Daly's chosen") {
  // C = 60 s, M = 6 h: Young sqrt(2 * 60 * 21600) = 1609.97 s;
  // r = C/2M = 1/720: Daly = 1609.97 (1 + sqrt(r)/3 + r/9) - 60.
  auto c = young_daly(60, 6 * 3600);
  REQUIRE(c);
  const double young = std::sqrt(2.0 * 60 * 21600), r = 60.0 / (2 * 21600);
  CHECK(c->young_s == Approx(young));
  CHECK(c->young_s == Approx(1609.97).epsilon(1e-5));
  CHECK(c->daly_s == Approx(young * (1 + std::sqrt(r) / 3 + r / 9) - 60));
  CHECK(c->daly_s == Approx(1570.22).epsilon(1e-5));
  CHECK(c->interval_s == c->daly_s);
  CHECK(c->explanation.find("C = checkpoint cost 60.000 s") != std::string::npos);
  CHECK(c->explanation.find("M = MTBF 21600.0 s") != std::string::npos);
  CHECK(c->explanation.find("Young's sqrt(2 C M) = 1609.969 s)") != std::string::npos);
  // A small cost against the MTBF: Daly's tends to Young's.
  auto small = young_daly(0.5, 1e7);
  REQUIRE(small);
  CHECK(small->daly_s / small->young_s == Approx(1.0).epsilon(1e-3));
  // C >= 2M: once per MTBF.
  auto big = young_daly(100, 40);
  REQUIRE(big);
  CHECK(big->interval_s == 40);
  CHECK(big->explanation.find("which is M itself") != std::string::npos);
  CHECK_FALSE(young_daly(0, 100));
  CHECK_FALSE(young_daly(1, -1));
  CHECK_FALSE(young_daly(NAN, 100));
}

TEST_CASE("parse_duration: units") {
  CHECK(*parse_duration("6h") == 21600);
  CHECK(*parse_duration("90m") == 5400);
  CHECK(*parse_duration("1.5d") == 129600);
  CHECK(*parse_duration("30s") == 30);
  CHECK(*parse_duration("250ms") == Approx(0.25));
  CHECK(*parse_duration("42") == 42);
  CHECK_FALSE(parse_duration(""));
  CHECK_FALSE(parse_duration("h"));
  CHECK_FALSE(parse_duration("6 hours"));
  CHECK_FALSE(parse_duration("-3s"));
}

namespace {
SeriesImage img(uint64_t seq, bool complete, const char* parent = nullptr) {
  SeriesImage s;
  s.seq = seq;
  s.name = series_name(seq);
  s.complete = complete;
  if (parent) s.parent = parent;
  return s;
}
}  // namespace

TEST_CASE("series_chain: an image and its parents, newest first, as far as the series holds them") {
  std::vector<SeriesImage> s = {img(1, true), img(2, true, "000001"), img(3, true, "000002"), img(4, true)};
  CHECK(series_chain(s, s[2]) == std::vector<std::string>{"000003", "000002", "000001"});
  CHECK(series_chain(s, s[3]) == std::vector<std::string>{"000004"});
  // A parent the series lacks (removed by hand) ends the chain.
  std::vector<SeriesImage> gap = {img(2, true, "000001"), img(3, true, "000002")};
  CHECK(series_chain(gap, gap[1]) == std::vector<std::string>{"000003", "000002"});
  // A loop (markers edited by hand) ends where a name comes again.
  std::vector<SeriesImage> loop = {img(1, true, "000002"), img(2, true, "000001")};
  CHECK(series_chain(loop, loop[1]) == std::vector<std::string>{"000002", "000001"});
}

TEST_CASE("series_to_remove: the last N complete kept, with their parents; failed dumps go") {
  // Full images: 1..5 complete, keep 2 -> 1, 2, 3 go.
  std::vector<SeriesImage> full = {img(1, true), img(2, true), img(3, true), img(4, true), img(5, true)};
  CHECK(series_to_remove(full, 2) == std::vector<std::string>{"000001", "000002", "000003"});
  // A newer dump not complete (failed or killed): it goes, and the two
  // newest complete stay (never removed before a newer one is complete).
  std::vector<SeriesImage> failed = {img(3, true), img(4, true), img(5, false)};
  CHECK(series_to_remove(failed, 2) == std::vector<std::string>{"000005"});
  CHECK(series_to_remove(failed, 1) == std::vector<std::string>{"000003", "000005"});
  // Chains: 1 full, 2 <- 1, 3 <- 2, 4 full, 5 <- 4. Keep 2 (4 and 5): 1-3 go.
  std::vector<SeriesImage> chains = {img(1, true), img(2, true, "000001"), img(3, true, "000002"), img(4, true),
                                     img(5, true, "000004")};
  CHECK(series_to_remove(chains, 2) == std::vector<std::string>{"000001", "000002", "000003"});
  // Keep 3 (3, 4, 5): 3's chain keeps 1 and 2.
  CHECK(series_to_remove(chains, 3).empty());
  // Keep 1 of an unbroken chain: every parent stays.
  std::vector<SeriesImage> chain = {img(1, true), img(2, true, "000001"), img(3, true, "000002")};
  CHECK(series_to_remove(chain, 1).empty());
  // keep 0 is read as 1: the image a restore needs stays.
  CHECK(series_to_remove(full, 0) == std::vector<std::string>{"000001", "000002", "000003", "000004"});
  // No complete image: only failed ones, all of which go.
  CHECK(series_to_remove({img(1, false)}, 3) == std::vector<std::string>{"000001"});
}

TEST_CASE("list_series, mark_complete, remove_series_dir on a directory") {
  phos::test::TempDir root;
  for (const char* d : {"000001", "000002", "000003", "notes"}) REQUIRE(::mkdir((root.path + "/" + d).c_str(), 0700) == 0);
  std::ofstream(root.path + "/000001/pages-1.img") << "criu's";
  std::ofstream(root.path + "/000010") << "a file, not a checkpoint";
  REQUIRE(mark_complete(root.path + "/000001", {"seq=1"}));
  REQUIRE(mark_complete(root.path + "/000002", {"seq=2", "parent=000001"}));
  auto s = list_series(root.path);
  REQUIRE(s);
  REQUIRE(s->size() == 3);
  CHECK((*s)[0].complete);
  CHECK(!(*s)[0].parent);
  CHECK((*s)[1].parent == std::optional<std::string>("000001"));
  CHECK(!(*s)[2].complete);
  CHECK(latest_complete(*s)->name == "000002");
  CHECK(::access((root.path + "/000002/phos-series-complete.tmp").c_str(), F_OK) != 0);
  REQUIRE(remove_series_dir(root.path, "000001"));
  CHECK(::access((root.path + "/000001").c_str(), F_OK) != 0);
  CHECK(::access((root.path + "/notes").c_str(), F_OK) == 0);
  CHECK_FALSE(remove_series_dir(root.path, "000099"));
  CHECK_FALSE(list_series(root.path + "/missing"));
}
