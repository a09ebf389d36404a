/*
 * Which UCX transport carries small GPU-memory messages through UCP (the layer Open MPI's pml/ucx
 * and MPICH use): a tag send from cuMemAlloc memory to host memory and back, over a loopback
 * endpoint, data checked through the CUDA driver. The program defines gdr_copy_to_mapping and
 * gdr_copy_from_mapping itself (exported with -rdynamic, so they take precedence for UCX's
 * dlopened gdr_copy module) to count how often gdr_copy is used, forwarding to our library.
 *
 *   ucp_gdr_probe [--expect-gdr]
 *
 * Message sizes stay in UCX's eager range (up to 4 KiB). Prints, per size, the number of
 * gdr_copy calls; exits 1 on a data mismatch, or with
 * --expect-gdr when a message did not go through gdr_copy.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <gdrapi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

static unsigned long n_to, n_from;

static void *gdrapi(const char *name)
{
    void *lib = dlopen("libgdrapi.so.2", RTLD_LAZY | RTLD_NOLOAD);
    void *f = lib ? dlsym(lib, name) : NULL;
    if (f == NULL) {
        fprintf(stderr, "ucp_gdr_probe: %s not found in libgdrapi.so.2\n", name);
        abort();
    }
    return f;
}

int gdr_copy_to_mapping(gdr_mh_t mh, void *map_d_ptr, const void *h_ptr, size_t size)
{
    static int (*real)(gdr_mh_t, void *, const void *, size_t);
    if (real == NULL)
        real = (int (*)(gdr_mh_t, void *, const void *, size_t))gdrapi("gdr_copy_to_mapping");
    n_to++;
    return real(mh, map_d_ptr, h_ptr, size);
}

int gdr_copy_from_mapping(gdr_mh_t mh, void *h_ptr, const void *map_d_ptr, size_t size)
{
    static int (*real)(gdr_mh_t, void *, const void *, size_t);
    if (real == NULL)
        real = (int (*)(gdr_mh_t, void *, const void *, size_t))gdrapi("gdr_copy_from_mapping");
    n_from++;
    return real(mh, h_ptr, map_d_ptr, size);
}

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "ucp_gdr_probe: " __VA_ARGS__);                               \
            fputc('\n', stderr);                                                           \
            exit(2);                                                                       \
        }                                                                                  \
    } while (0)

static void wait_req(ucp_worker_h w, void *req, const char *what)
{
    if (req == NULL)
        return;
    CHECK(!UCS_PTR_IS_ERR(req), "%s: %s", what, ucs_status_string(UCS_PTR_STATUS(req)));
    while (ucp_request_check_status(req) == UCS_INPROGRESS)
        ucp_worker_progress(w);
    CHECK(ucp_request_check_status(req) == UCS_OK, "%s: %s", what,
          ucs_status_string(ucp_request_check_status(req)));
    ucp_request_free(req);
}

int main(int argc, char **argv)
{
    int expect_gdr = argc > 1 && strcmp(argv[1], "--expect-gdr") == 0;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr d;
    CHECK(cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS, "no CUDA device");
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS && cuCtxSetCurrent(ctx) == CUDA_SUCCESS,
          "no context");
    const size_t cap = 1 << 16;
    CHECK(cuMemAlloc(&d, cap) == CUDA_SUCCESS, "cuMemAlloc");

    ucp_config_t *config;
    ucp_context_h context;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    ucp_ep_h ep;
    CHECK(ucp_config_read(NULL, NULL, &config) == UCS_OK, "ucp_config_read");
    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
    CHECK(ucp_init(&params, config, &context) == UCS_OK, "ucp_init");
    ucp_config_release(config);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    CHECK(ucp_worker_create(context, &wp, &worker) == UCS_OK, "ucp_worker_create");
    CHECK(ucp_worker_get_address(worker, &addr, &addr_len) == UCS_OK, "get_address");
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                                 .address = addr};
    CHECK(ucp_ep_create(worker, &ep_params, &ep) == UCS_OK, "ucp_ep_create");

    /* Eager sizes only: from 8 KiB UCX 1.13 switches to rendezvous, which over this loopback
     * endpoint reads gpusim memory with CMA (process_vm_readv, EFAULT) and aborts; see
     * docs/consumers.md. */
    static const size_t sizes[] = {1, 8, 64, 93, 256, 1024, 2048, 4096};
    unsigned char *src = malloc(cap), *dst = malloc(cap);
    int missed = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t n = sizes[i];
        unsigned long to0 = n_to, from0 = n_from;
        ucp_request_param_t rp = {.op_attr_mask = 0};
        /* device -> host */
        for (size_t k = 0; k < n; k++)
            src[k] = (unsigned char)(k * 7 + i + 1);
        memset(dst, 0, n);
        CHECK(cuMemcpyHtoD(d, src, n) == CUDA_SUCCESS, "HtoD");
        void *r = ucp_tag_recv_nbx(worker, dst, n, 1, ~0ull, &rp);
        void *s = ucp_tag_send_nbx(ep, (void *)(uintptr_t)d, n, 1, &rp);
        wait_req(worker, s, "send from GPU");
        wait_req(worker, r, "recv to host");
        if (memcmp(src, dst, n) != 0) {
            fprintf(stderr, "ucp_gdr_probe: GPU->host %zu bytes: data differ\n", n);
            return 1;
        }
        /* host -> device */
        for (size_t k = 0; k < n; k++)
            src[k] = (unsigned char)(k * 13 + i + 3);
        CHECK(cuMemsetD8(d, 0, n) == CUDA_SUCCESS, "memset");
        r = ucp_tag_recv_nbx(worker, (void *)(uintptr_t)d, n, 2, ~0ull, &rp);
        s = ucp_tag_send_nbx(ep, src, n, 2, &rp);
        wait_req(worker, s, "send from host");
        wait_req(worker, r, "recv to GPU");
        CHECK(cuMemcpyDtoH(dst, d, n) == CUDA_SUCCESS, "DtoH");
        if (memcmp(src, dst, n) != 0) {
            fprintf(stderr, "ucp_gdr_probe: host->GPU %zu bytes: data differ\n", n);
            return 1;
        }
        printf("ucp_gdr_probe: %5zu bytes: data ok; gdr_copy_from_mapping %lu, gdr_copy_to_mapping %lu\n",
               n, n_from - from0, n_to - to0);
        if (n_from == from0 || n_to == to0)
            missed++;
    }
    ucp_worker_release_address(worker, addr);
    void *c = ucp_ep_close_nb(ep, UCP_EP_CLOSE_MODE_FORCE);
    if (c != NULL && !UCS_PTR_IS_ERR(c)) {
        while (ucp_request_check_status(c) == UCS_INPROGRESS)
            ucp_worker_progress(worker);
        ucp_request_free(c);
    }
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    cuMemFree(d);
    free(src);
    free(dst);
    printf("ucp_gdr_probe: %d of 8 sizes did not use gdr_copy in both directions\n", missed);
    return expect_gdr && missed ? 1 : 0;
}
