// Logging into CRIU's log (print_on_level, which criu exports to plugins),
// or to stderr in programs that are not criu (phosctl, tests).
#pragma once

namespace phos::plugin {

enum class LogLevel : unsigned { kError = 1, kWarn = 2, kInfo = 3, kDebug = 4 };

void log(LogLevel level, const char* format, ...) __attribute__((format(printf, 2, 3)));
// Outside criu, messages up to `level` go to stderr (default: warnings).
void set_stderr_level(LogLevel level);

#define PHOS_ERR(...) ::phos::plugin::log(::phos::plugin::LogLevel::kError, __VA_ARGS__)
#define PHOS_WARN(...) ::phos::plugin::log(::phos::plugin::LogLevel::kWarn, __VA_ARGS__)
#define PHOS_INFO(...) ::phos::plugin::log(::phos::plugin::LogLevel::kInfo, __VA_ARGS__)
#define PHOS_DEBUG(...) ::phos::plugin::log(::phos::plugin::LogLevel::kDebug, __VA_ARGS__)

}  // namespace phos::plugin
