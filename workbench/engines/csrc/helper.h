// decode_helper.cpp's spinning helper thread, for the other kernels' two-thread forms.
#pragma once

#include <functional>

namespace workbench_cpu {

// `theirs` on the helper thread and `mine` on the calling one at once; returns when both ended (an
// error of either is rethrown here). Another thread using the helper meanwhile: both run here.
// Each runs on one OpenMP thread.
void run_both(const std::function<void()>& mine, const std::function<void()>& theirs);

}  // namespace workbench_cpu
