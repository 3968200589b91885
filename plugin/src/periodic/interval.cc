// Young's and Daly's checkpoint intervals (periodic.h).
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "phos/plugin/periodic.h"

namespace phos::plugin {

Result<IntervalChoice> young_daly(double cost_s, double mtbf_s) {
  if (!(cost_s > 0) || !std::isfinite(cost_s))
    return make_error("the checkpoint cost must be a positive number of seconds", EINVAL);
  if (!(mtbf_s > 0) || !std::isfinite(mtbf_s))
    return make_error("the mean time between failures must be a positive number of seconds", EINVAL);
  IntervalChoice c;
  c.cost_s = cost_s;
  c.mtbf_s = mtbf_s;
  c.young_s = std::sqrt(2.0 * cost_s * mtbf_s);
  const double r = cost_s / (2.0 * mtbf_s);
  // Daly's expansion holds for C < 2M; past it, checkpoint once per MTBF.
  c.daly_s = r < 1.0 ? c.young_s * (1.0 + std::sqrt(r) / 3.0 + r / 9.0) - cost_s : mtbf_s;
  c.interval_s = c.daly_s;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "interval %.3f s (Daly: sqrt(2 C M) (1 + sqrt(C/2M)/3 + C/18M) - C%s, with C = checkpoint cost "
                "%.3f s, M = MTBF %.1f s; Young's sqrt(2 C M) = %.3f s)",
                c.interval_s, r < 1.0 ? "" : ", which is M itself since C >= 2M", cost_s, mtbf_s, c.young_s);
  c.explanation = buf;
  return c;
}

Result<double> parse_duration(const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || errno != 0 || !std::isfinite(v) || v < 0)
    return make_error("'" + text + "' is not a duration (e.g. 6h, 90m, 30s, 1.5d, 250ms)", EINVAL);
  const std::string unit(end);
  double scale = 0;
  if (unit.empty() || unit == "s") scale = 1;
  else if (unit == "ms") scale = 1e-3;
  else if (unit == "m" || unit == "min") scale = 60;
  else if (unit == "h") scale = 3600;
  else if (unit == "d") scale = 86400;
  else return make_error("'" + text + "': unknown unit '" + unit + "' (ms, s, m, h, d)", EINVAL);
  return v * scale;
}

}  // namespace phos::plugin
