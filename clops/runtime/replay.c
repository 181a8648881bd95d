/* Runtime, replay: a launch plan's kernels enqueued in order from one call (rawenqueue.py),
   through the clEnqueueNDRangeKernel of the OpenCL loader that pyopencl loaded, passed as a
   pointer (so that this library links against no OpenCL). Launch i: kernel kernels[i] of
   dims[i] dimensions, global sizes gs[3i ..], local sizes ls[3i ..] (none where ls[3i] is 0),
   no events. Returns 0, or the failed launch's status code with its index in *failed (the
   launches before it were enqueued). */
#include <stddef.h>
#include <stdint.h>

typedef int32_t (*enqueue_fn)(void *queue, void *kernel, uint32_t dims, const size_t *offset,
                              const size_t *global, const size_t *local, uint32_t n_wait,
                              const void *wait, void *event);

int clops_replay_version(void) { return 1; }

int32_t clops_replay(void *fn, void *queue, int32_t n, void *const *kernels,
                     const uint32_t *dims, const size_t *gs, const size_t *ls, int32_t *failed) {
    const enqueue_fn enqueue = (enqueue_fn)fn;
    for (int32_t i = 0; i < n; ++i) {
        const size_t *local = ls[3 * (size_t)i] ? ls + 3 * (size_t)i : NULL;
        const int32_t rc = enqueue(queue, kernels[i], dims[i], NULL, gs + 3 * (size_t)i, local,
                                   0, NULL, NULL);
        if (rc) {
            *failed = i;
            return rc;
        }
    }
    return 0;
}
