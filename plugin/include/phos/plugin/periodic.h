// Periodic checkpoints of one job (phosctl periodic, phosctl supervise):
// the interval between them, and the series of image directories they
// leave, of which the last N complete ones are kept.
//
// A series lives in one root directory: each checkpoint in a directory of
// its own named by its number ("000007"), complete once the marker file
// phos-series-complete is in it (written after criu succeeded and every GPU
// image in it is complete). An incremental image names its parent there
// ("parent=000006"); a kept image's parents are kept too (the chain is kept,
// not merged: no image is rewritten, and a full image every few dumps
// bounds the chain).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "phos/support/result.h"

namespace phos::plugin {

// ---- the interval ----------------------------------------------------------

// The interval that wastes the least of a job's time, for a checkpoint that
// costs the job `cost_s` and failures every `mtbf_s` on average.
//   Young (1974):  sqrt(2 C M)
//   Daly (2006):   sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C  where C < 2M, else M
// Daly's is the one chosen (it keeps Young's first-order optimum and
// corrects it where C is not small against M); both are reported.
struct IntervalChoice {
  double cost_s = 0, mtbf_s = 0;
  double young_s = 0, daly_s = 0;
  double interval_s = 0;  // Daly's
  // What was chosen and why, on one line (formula, inputs, result).
  std::string explanation;
};
Result<IntervalChoice> young_daly(double cost_s, double mtbf_s);

// "6h", "90m", "30s", "1.5d", "250ms" or a plain number of seconds.
Result<double> parse_duration(const std::string& text);

// ---- the series ------------------------------------------------------------

inline constexpr const char* kSeriesMarker = "phos-series-complete";

struct SeriesImage {
  uint64_t seq = 0;
  std::string name;                  // "000007"
  bool complete = false;             // the marker is there
  std::optional<std::string> parent; // an incremental image's parent's name
};

// The checkpoint directory of number `seq`.
std::string series_name(uint64_t seq);
// Every checkpoint directory under `root`, oldest first (other entries are
// left alone).
Result<std::vector<SeriesImage>> list_series(const std::string& root);
// The newest complete checkpoint; none: no complete one.
std::optional<SeriesImage> latest_complete(const std::vector<SeriesImage>& series);
// `from`'s name, then its parent's, and so on, as far as the series holds
// them (a missing parent ends the chain; a name seen twice, a loop, too).
std::vector<std::string> series_chain(const std::vector<SeriesImage>& series, const SeriesImage& from);

// Which directories go, once no dump is running: every incomplete one (a
// dump that failed or was killed), and complete ones older than the newest
// `keep` complete ones unless a kept image's chain of parents reaches them.
// A complete image is never removed before a newer one is complete.
std::vector<std::string> series_to_remove(const std::vector<SeriesImage>& series, size_t keep);

// The marker, written atomically (a temporary file renamed, the directory
// synced): `lines` are "key=value" records (parent=, cost figures).
Result<void> mark_complete(const std::string& dir, const std::vector<std::string>& lines);

// A checkpoint directory and what is in it, removed (regular files and the
// directory; nothing is followed).
Result<void> remove_series_dir(const std::string& root, const std::string& name);

}  // namespace phos::plugin
