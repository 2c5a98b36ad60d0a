// The operator's metrics fed from what its controller reports: reconciles, the work queue,
// resizes, each job's workers and progress, the GPU inventory; and a job's series removed once
// the job is gone, whether a user deleted it or the operator did after its
// spec.runPolicy.ttlSecondsAfterFinished.
#pragma once

#include "operator/controller/controller.h"
#include "operator/metrics/operator_metrics.h"

namespace vf {

// Sets the metric callbacks of `options` (on_reconcile, on_queue_depth and every ReconcilerHooks
// field) to update `metrics`, which must outlive every controller run with `options`. The
// callbacks may be called from any thread: OperatorMetrics is thread-safe, and the jobs-by-phase
// bookkeeping they share is behind a mutex.
void ReportControllerMetrics(controller::ControllerOptions& options, OperatorMetrics& metrics);

}  // namespace vf
