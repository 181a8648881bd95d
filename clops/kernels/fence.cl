// A device-wide fence between a work-group's partial and the counter that announces it, for the
// kernels whose last work-group to finish combines the others' partials (attention.cl,
// argmax.cl), and layer.cl's portable grid barrier. PTX_FENCE 1 (NVIDIA): membar.gl.
#if PTX_FENCE
#define GLOBAL_FENCE() asm volatile("membar.gl;" ::: "memory")
#else
#define GLOBAL_FENCE() mem_fence(CLK_GLOBAL_MEM_FENCE)
#endif
