// Test hook of common/log: while a sink is set, every line that would print
// goes to sink(user, level, message) instead of stderr (the message without
// its prefix); nullptr restores stderr. Set and clear it while no other thread
// logs. Tests count the warnings they expect with it (tests/common/log_capture.h)
// instead of printing them. Apart from log.h so that no library file sees it.
#pragma once

#include "common/log.h"

namespace ucm {

using LogSink = void (*)(void* user, LogLevel level, const char* message);
void log_set_sink(LogSink sink, void* user);

}  // namespace ucm
