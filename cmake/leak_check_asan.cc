// Runs LeakSanitizer's check when a _asan unit test's cases are done, before the program exits
// (cmake/VfTargets.cmake links it into each). Thread-safety: gtest calls it once, on the main
// thread.
//
// At exit, LeakSanitizer checks after the static objects are destroyed, and cpprest's shared
// thread pool is one of them: its destructor stops the pool, and a task the pool had queued but
// not started is dropped with all it holds (cpprest queues a raw pointer to it). A test that
// ends just after a request failed or timed out leaves such a task on a busy machine (the
// continuation that closes the answer's body), and the check at exit reported it as a leak of
// the test's, one that a running process does not have. Checked here, while the pool still
// holds its queue, such tasks are reachable, and what a test lost is still reported. The check at
// exit is then skipped: LeakSanitizer checks once.
#include <gtest/gtest.h>
#include <sanitizer/lsan_interface.h>

namespace {

class LeakCheckWhenTestsEnd : public testing::Environment {
 public:
  void TearDown() override { __lsan_do_leak_check(); }
};

// gtest owns the environment from here on.
[[maybe_unused]] testing::Environment* const kLeakCheck =
    testing::AddGlobalTestEnvironment(new LeakCheckWhenTestsEnd);

}  // namespace
