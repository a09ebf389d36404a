// Kernel-side use of <gdsync/device.cuh>: a CUDA thread waits on a host word through the device
// address gds_mlx5_get_dword_wait_info() returns, then releases a second word, for every wait
// condition; an invalid condition must return ERROR_INVALID at once. Then a stream descriptor
// waits on the kernel's release, mixing kernel-side and stream-side synchronisation.
#include <gdsync.h>
#include <gdsync/mlx5.h>
#include <gdsync/tools.h>
#include <gdsync/device.cuh>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

__global__ void waiter(gdsync::isem32_t sem, gdsync::wait_cond_t cond, gdsync::isem32_t rel, int *ret)
{
    int r = gdsync::device::wait(sem, cond);
    *ret = r;
    if (r == 0) {
        __threadfence_system();
        gdsync::device::release(rel);
    }
}

static int failures;
#define CHECK(c, ...) do { if (!(c)) { printf("FAIL line %d: ", __LINE__); printf(__VA_ARGS__); printf("\n"); failures++; } } while (0)

int main()
{
    cudaFree(0); // primary context current
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    gds_mem_desc_t mem;
    memset(&mem, 0, sizeof(mem));
    if (gds_alloc_mapped_memory(&mem, 4096, GDS_MEMORY_HOST)) { printf("FAIL alloc\n"); return 1; }
    volatile uint32_t *flag = (uint32_t *)mem.h_ptr, *ack = flag + 16, *done = flag + 32;
    int *dret;
    cudaMalloc(&dret, sizeof(int));

    struct { gds_wait_cond_flag_t cond; uint32_t before, value, after; const char *name; } cases[] = {
        { GDS_WAIT_COND_EQ, 0, 5, 5, "EQ" },
        { GDS_WAIT_COND_GEQ, 0xfffffff0u, 2, 3, "GEQ (cyclic)" },
        { GDS_WAIT_COND_AND, 0x10, 0x6, 0x4, "AND" },
        { GDS_WAIT_COND_NOR, 0xffffffffu, 0, 0xfffffffeu, "NOR" },
    };
    for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        *flag = cases[i].before;
        *ack = 0;
        gds_mlx5_dword_wait_info_t wi, ai;
        CHECK(gds_mlx5_get_dword_wait_info((uint32_t *)flag, cases[i].value, GDS_MEMORY_HOST, &wi) == 0, "wait info");
        CHECK(gds_mlx5_get_dword_wait_info((uint32_t *)ack, 0x1234 + i, GDS_MEMORY_HOST, &ai) == 0, "ack info");
        gdsync::isem32_t sem, rel;
        sem.ptr = wi.ptr; sem.value = wi.value;
        rel.ptr = ai.ptr; rel.value = ai.value;
        waiter<<<1, 1, 0, s>>>(sem, cases[i].cond, rel, dret);
        usleep(20000);
        CHECK(cudaStreamQuery(s) == cudaErrorNotReady, "%s: kernel did not wait", cases[i].name);
        CHECK(*ack == 0, "%s: released too early", cases[i].name);
        *flag = cases[i].after;
        CHECK(cudaStreamSynchronize(s) == cudaSuccess, "%s: sync", cases[i].name);
        int r = -1;
        cudaMemcpy(&r, dret, sizeof(int), cudaMemcpyDeviceToHost);
        CHECK(r == 0 && *ack == 0x1234 + i, "%s: ret %d ack %#x", cases[i].name, r, *ack);
        printf("%s %s\n", r == 0 && *ack == 0x1234 + i ? "ok  " : "FAIL", cases[i].name);
    }
    {   // invalid condition: immediate ERROR_INVALID
        gdsync::isem32_t sem, rel;
        sem.ptr = (uint32_t *)mem.d_ptr; sem.value = 0;
        rel.ptr = (uint32_t *)(mem.d_ptr + 64); rel.value = 0;
        waiter<<<1, 1, 0, s>>>(sem, (gdsync::wait_cond_t)7, rel, dret);
        cudaStreamSynchronize(s);
        int r = -1;
        cudaMemcpy(&r, dret, sizeof(int), cudaMemcpyDeviceToHost);
        CHECK(r == gdsync::ERROR_INVALID, "invalid cond returned %d", r);
        printf("%s invalid condition -> %d\n", r == gdsync::ERROR_INVALID ? "ok  " : "FAIL", r);
    }
    {   // kernel releases a word that a stream descriptor then waits on
        *flag = 0; *ack = 0; *done = 0;
        gds_mlx5_dword_wait_info_t wi, ai;
        gds_mlx5_get_dword_wait_info((uint32_t *)flag, 1, GDS_MEMORY_HOST, &wi);
        gds_mlx5_get_dword_wait_info((uint32_t *)ack, 77, GDS_MEMORY_HOST, &ai);
        gdsync::isem32_t sem, rel;
        sem.ptr = wi.ptr; sem.value = wi.value;
        rel.ptr = ai.ptr; rel.value = ai.value;
        waiter<<<1, 1, 0, s>>>(sem, GDS_WAIT_COND_GEQ, rel, dret);
        gds_descriptor_t d[2];
        d[0].tag = GDS_TAG_WAIT_VALUE32;
        gds_prepare_wait_value32(&d[0].wait32, (uint32_t *)ack, 77, GDS_WAIT_COND_EQ, GDS_MEMORY_HOST);
        d[1].tag = GDS_TAG_WRITE_VALUE32;
        gds_prepare_write_value32(&d[1].write32, (uint32_t *)done, 99, GDS_MEMORY_HOST);
        CHECK(gds_stream_post_descriptors((CUstream)s, 2, d, 0) == 0, "post");
        usleep(10000);
        CHECK(*done == 0, "descriptor ran before the kernel");
        *flag = 1;
        cudaStreamSynchronize(s);
        CHECK(*ack == 77 && *done == 99, "ack %u done %u", *ack, *done);
        printf("%s kernel release -> stream wait -> stream write\n", *done == 99 ? "ok  " : "FAIL");
    }
    cudaFree(dret);
    gds_free_mapped_memory(&mem);
    printf("device_test: %s\n", failures ? "FAILED" : "passed");
    return failures ? 1 : 0;
}
