/*
 * libnvm (the library) through the helper module kmod/libnvm: the path upstream's
 * nvm-identify and the CUDA examples take. Usage: vm_libnvm_module /dev/libnvmN
 *
 * The controller is already bound to "libnvm helper" (tests/vm/suites/28-libnvm-module-lib.sh).
 * Checks, each asserting data: nvm_ctrl_init on the node (version check, BAR0 mapping through the
 * module), nvm_aq_create (reset) on a window from nvm_dma_map_host, identify controller and
 * namespace, an I/O queue pair in module-pinned host memory, reads into host memory (PRP1+PRP2
 * and a PRP list) and into gpusim GPU memory mapped with nvm_dma_map_device (a list spanning two
 * 64 KiB GPU pages), checked against the image pattern (tests/vm/nvme/image.py) through the
 * gpusim mapping, nothing written past the read, and that every unmap gives back its pins
 * (gpusim's active_pins, the module's window counters). Reads only: the image is not written.
 * Prints "ok - ..." / "not ok - ..." lines and exits 0 only when everything holds.
 */
#include <nvm_types.h>
#include <nvm_ctrl.h>
#include <nvm_dma.h>
#include <nvm_aq.h>
#include <nvm_admin.h>
#include <nvm_rpc.h>
#include <nvm_cmd.h>
#include <nvm_queue.h>
#include <nvm_util.h>
#include <nvm_error.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include "gpusim_uapi.h"

/* nvm_dma.h declares this only for CUDA builds (__CUDA__, as upstream); the symbol is always
 * exported, and a gpusim GPU VA is what cuMemAlloc would return under cudasim. */
int nvm_dma_map_device(nvm_dma_t** map, const nvm_ctrl_t* ctrl, void* devptr, size_t size);

#define PATTERN_TAG (0xA5ULL << 56)
#define GPG 0x10000UL
#define FILL 0x5a5a5a5a5a5a5a5aULL

#include "../lib/check.h"

#define OK(cond, ...) check_report(!!(cond), __VA_ARGS__)
#define MUST(cond, ...) do { OK(cond, __VA_ARGS__); if (!(cond)) { return 1; } } while (0)

static long long stat_of(const char* file, const char* key)
{
    char line[256];
    size_t kl = strlen(key);
    long long v = -1;
    FILE* f = fopen(file, "r");
    if (!f) {
        return -1;
    }
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtoll(line + kl + 1, NULL, 0);
        }
    }
    fclose(f);
    return v;
}
#define LSTAT(k) stat_of("/sys/kernel/debug/libnvm/stats", k)
#define GSTAT(k) stat_of("/sys/kernel/debug/gpusim/stats", k)

/* Compares len bytes (multiple of 8) read from disk offset off against the never-written image. */
static int check(const volatile void* data, size_t len, uint64_t off)
{
    const volatile uint64_t* w = (const volatile uint64_t*) data;
    size_t i;
    for (i = 0; i < len / 8; ++i) {
        if (w[i] != (PATTERN_TAG | (off + 8 * i))) {
            printf("# word at disk byte %llu is %016llx, expected %016llx\n", (unsigned long long) (off + 8 * i),
                   (unsigned long long) w[i], (unsigned long long) (PATTERN_TAG | (off + 8 * i)));
            return 0;
        }
    }
    return 1;
}

static int all_fill(const volatile void* data, size_t len)
{
    const volatile uint64_t* w = (const volatile uint64_t*) data;
    size_t i;
    for (i = 0; i < len / 8; ++i) {
        if (w[i] != FILL) {
            return 0;
        }
    }
    return 1;
}

static size_t ps;
static nvm_queue_t cq, sq;
static nvm_dma_t* qwin; /* page 0: CQ, page 1: SQ, page 2: PRP list */

/* One read of nblks blocks at lba into the n controller pages ioaddrs[0..n); waits for it. */
static int read_into(uint64_t lba, uint16_t nblks, const uint64_t* ioaddrs, size_t n)
{
    nvm_cmd_t* cmd = nvm_sq_enqueue(&sq);
    nvm_cpl_t* cpl;
    int st;
    if (cmd == NULL) {
        return EAGAIN;
    }
    nvm_cmd_header(cmd, NVM_DEFAULT_CID(&sq), NVM_IO_READ, 1);
    nvm_cmd_data(cmd, ps, n, NVM_DMA_OFFSET(qwin, 2), qwin->ioaddrs[2], (uint64_t*) ioaddrs);
    nvm_cmd_rw_blks(cmd, lba, nblks);
    nvm_sq_submit(&sq);
    cpl = nvm_cq_dequeue_block(&cq, 10000);
    if (cpl == NULL) {
        return ETIME;
    }
    st = NVM_ERR_STATUS(cpl);
    nvm_sq_update(&sq);
    nvm_cq_update(&cq);
    return st;
}

/* Page-aligned, zeroed host memory of `pages` controller pages. */
static void* host_pages(size_t pages)
{
    void* p = NULL;
    if (posix_memalign(&p, ps, pages * ps) != 0) {
        return NULL;
    }
    memset(p, 0, pages * ps);
    return p;
}

/* --------------------------------------------------------------------------------------------
 * GPU memory from cudasim's cuMemAlloc (libcuda.so.1 on the loader path; its device memory is
 * gpusim's BAR), as a CUDA program gets it: queues, PRP lists and data in GPU memory. cudasim
 * maps each allocation at its device address, so the host polls the CQ there, standing in for
 * the GPU thread (or gdrcopy mapping) that would on real hardware.
 */
struct cuda_api {
    int (*init)(unsigned);
    int (*device_get)(int*, int);
    int (*ctx_create)(void**, unsigned, int);
    int (*ctx_destroy)(void*);
    int (*mem_alloc)(unsigned long long*, size_t);
    int (*mem_free)(unsigned long long);
    int (*memset_d8)(unsigned long long, unsigned char, size_t);
    int (*dtoh)(void*, unsigned long long, size_t);
};

static int cuda_load(struct cuda_api* cu)
{
    void* h = dlopen("libcuda.so.1", RTLD_NOW);
    if (h == NULL) {
        printf("# dlopen libcuda.so.1: %s\n", dlerror());
        return 0;
    }
    *(void**) &cu->init = dlsym(h, "cuInit");
    *(void**) &cu->device_get = dlsym(h, "cuDeviceGet");
    *(void**) &cu->ctx_create = dlsym(h, "cuCtxCreate_v2");
    *(void**) &cu->ctx_destroy = dlsym(h, "cuCtxDestroy_v2");
    *(void**) &cu->mem_alloc = dlsym(h, "cuMemAlloc_v2");
    *(void**) &cu->mem_free = dlsym(h, "cuMemFree_v2");
    *(void**) &cu->memset_d8 = dlsym(h, "cuMemsetD8_v2");
    *(void**) &cu->dtoh = dlsym(h, "cuMemcpyDtoH_v2");
    return cu->init && cu->device_get && cu->ctx_create && cu->ctx_destroy && cu->mem_alloc && cu->mem_free &&
           cu->memset_d8 && cu->dtoh;
}

/* One read on (sq, cq) with the slot's PRP list page in window lw at page l0 + slot. */
static int qp_read(nvm_queue_t* q_sq, nvm_queue_t* q_cq, const nvm_dma_t* lw, size_t l0, uint64_t lba, uint16_t nblks,
                   const uint64_t* io, size_t n, uint16_t* cid_out, int wait)
{
    nvm_cmd_t* cmd = nvm_sq_enqueue(q_sq);
    nvm_cpl_t* cpl;
    int st;
    if (cmd == NULL) {
        return EAGAIN;
    }
    size_t slot = (size_t) (cmd - (nvm_cmd_t*) q_sq->vaddr);
    nvm_cmd_header(cmd, NVM_DEFAULT_CID(q_sq), NVM_IO_READ, 1);
    nvm_cmd_data(cmd, ps, n, NVM_DMA_OFFSET(lw, l0 + slot), lw->ioaddrs[l0 + slot], (uint64_t*) io);
    nvm_cmd_rw_blks(cmd, lba, nblks);
    if (cid_out) {
        *cid_out = *NVM_CMD_CID(cmd);
    }
    if (!wait) {
        return 0;
    }
    nvm_sq_submit(q_sq);
    cpl = nvm_cq_dequeue_block(q_cq, 10000);
    if (cpl == NULL) {
        return ETIME;
    }
    st = NVM_ERR_STATUS(cpl);
    nvm_sq_update(q_sq);
    nvm_cq_update(q_cq);
    return st;
}

static void gpu_queue_tests(nvm_aq_ref aq, const nvm_ctrl_t* ctrl, const struct gpusim_info* gi, const nvm_dma_t* host,
                            void* host_va, long long pins0)
{
    struct cuda_api cu;
    void* ctx = NULL;
    int dev = 0, rc;
    unsigned long long dptr = 0;
    const size_t gsz = 2 << 20;
    nvm_dma_t* gw = NULL;
    nvm_queue_t gcq, gsq;
    enum { CQPG = 0, SQPG = 1, LIST0 = 2, DATA0 = 128, WRAP0 = 256 };
    size_t mdts = 512 * 1024 / ps, k;
    uint8_t* copy;

    if (!cuda_load(&cu)) {
        OK(0, "cudasim's libcuda.so.1 loads with the driver API this test uses");
        return;
    }
    rc = cu.init(0);
    if (rc == 0) {
        rc = cu.device_get(&dev, 0);
    }
    if (rc == 0) {
        rc = cu.ctx_create(&ctx, 0, dev);
    }
    if (rc == 0) {
        rc = cu.mem_alloc(&dptr, gsz);
    }
    OK(rc == 0 && dptr % GPG == 0, "cuMemAlloc %zu KiB (cudasim): CUresult %d, dptr 0x%llx (64 KiB aligned)", gsz >> 10,
       rc, dptr);
    if (rc != 0 || dptr % GPG != 0) {
        return;
    }
    rc = cu.memset_d8(dptr, 0, gsz);
    rc = rc ? rc : nvm_dma_map_device(&gw, ctrl, (void*) (uintptr_t) dptr, gsz);
    OK(rc == 0 && gw->n_ioaddrs == gsz / ps && gw->ioaddrs[0] >= gi->bar_phys &&
       gw->ioaddrs[gsz / ps - 1] < gi->bar_phys + gi->bar_size && GSTAT("active_pins") == pins0 + 1,
       "nvm_dma_map_device of the cuMemAlloc memory: %zu controller pages inside the gpusim BAR, one pin: %s",
       gw ? gw->n_ioaddrs : 0, nvm_strerror(rc));
    if (rc != 0) {
        cu.mem_free(dptr);
        return;
    }
    volatile uint8_t* g = (volatile uint8_t*) (uintptr_t) dptr;
    rc = nvm_admin_cq_create(aq, &gcq, 2, (void*) (g + CQPG * ps), gw->ioaddrs[CQPG]);
    OK(rc == 0, "CQ 2 in GPU memory: %s", nvm_strerror(rc));
    rc = rc ? rc : nvm_admin_sq_create(aq, &gsq, &gcq, 2, (void*) (g + SQPG * ps), gw->ioaddrs[SQPG]);
    OK(rc == 0 && gsq.max_entries == 64, "SQ 2 in GPU memory (%u entries): %s", gsq.max_entries, nvm_strerror(rc));
    copy = (uint8_t*) malloc(mdts * ps);
    if (rc == 0 && copy != NULL) {
        /* PRP1, PRP1+PRP2, MDTS through a PRP list in GPU memory: data in GPU memory */
        rc = qp_read(&gsq, &gcq, gw, LIST0, 33, 8, gw->ioaddrs + DATA0, 1, NULL, 1);
        OK(rc == 0 && cu.dtoh(copy, dptr + DATA0 * ps, ps) == 0 && check(copy, ps, 33 * 512),
           "GPU queues: read 4 KiB into GPU memory (PRP1), checked with cuMemcpyDtoH: %s", nvm_strerror(rc));
        rc = qp_read(&gsq, &gcq, gw, LIST0, 3000, 16, gw->ioaddrs + DATA0 + 1, 2, NULL, 1);
        OK(rc == 0 && cu.dtoh(copy, dptr + (DATA0 + 1) * ps, 2 * ps) == 0 && check(copy, 2 * ps, 3000 * 512),
           "GPU queues: read 8 KiB into GPU memory (PRP1+PRP2): %s", nvm_strerror(rc));
        rc = qp_read(&gsq, &gcq, gw, LIST0, 20000, (uint16_t) (mdts * ps / 512), gw->ioaddrs + DATA0, mdts, NULL, 1);
        OK(rc == 0 && cu.dtoh(copy, dptr + DATA0 * ps, mdts * ps) == 0 && check(copy, mdts * ps, 20000ULL * 512),
           "GPU queues: read MDTS (%zu KiB) into GPU memory, PRP list in GPU memory: %s", mdts * ps >> 10,
           nvm_strerror(rc));
        /* data in host memory, PRP list in GPU memory */
        memset(host_va, 0, host->n_ioaddrs * ps);
        rc = qp_read(&gsq, &gcq, gw, LIST0, 7777, (uint16_t) (host->n_ioaddrs * ps / 512), host->ioaddrs,
                     host->n_ioaddrs, NULL, 1);
        OK(rc == 0 && check(host_va, host->n_ioaddrs * ps, 7777ULL * 512),
           "GPU queues: read %zu pages into host memory through a PRP list in GPU memory: %s", host->n_ioaddrs,
           nvm_strerror(rc));
        /* wrap: 640 reads at depth 16 (SQ 10 times, CQ 2.5 times), data in GPU memory */
        uint64_t lba_of[128];
        size_t page_of[128], freep[16];
        int nfree = 16, sent = 0, done = 0, bad = 0;
        const int total = 640;
        for (k = 0; k < 16; ++k) {
            freep[k] = k;
        }
        while (done < total && !bad) {
            while (sent < total && nfree > 0) {
                /* below every region the storage suites write (27-libnvm-pq: from LBA 40960) */
                uint64_t lba = ((uint64_t) sent * 7907 * 8) % 39992;
                size_t page = freep[nfree - 1];
                uint16_t cid;
                if (qp_read(&gsq, &gcq, gw, LIST0, lba, 8, gw->ioaddrs + WRAP0 + page, 1, &cid, 0) != 0) {
                    break;
                }
                --nfree;
                lba_of[cid % 128] = lba;
                page_of[cid % 128] = page;
                ++sent;
            }
            nvm_sq_submit(&gsq);
            nvm_cpl_t* cpl = nvm_cq_dequeue_block(&gcq, 10000);
            if (cpl == NULL) {
                bad = 1;
                break;
            }
            uint16_t cid = *NVM_CPL_CID(cpl);
            bad = NVM_ERR_OK(cpl) ? 0 : 2;
            nvm_sq_update(&gsq);
            nvm_cq_update(&gcq);
            if (!bad && !check(g + (WRAP0 + page_of[cid % 128]) * ps, ps, lba_of[cid % 128] * 512)) {
                bad = 3;
            }
            freep[nfree++] = page_of[cid % 128];
            ++done;
        }
        OK(!bad && done == total, "GPU queues: %d reads at depth 16 into GPU memory (SQ wrapped %d times): %s", done,
           done / 64, bad == 1 ? "timeout" : bad == 2 ? "error status" : bad == 3 ? "wrong data" : "data verified");
        rc = nvm_admin_sq_delete(aq, &gsq, &gcq);
        OK(rc == 0, "delete SQ 2: %s", nvm_strerror(rc));
        rc = nvm_admin_cq_delete(aq, &gcq);
        OK(rc == 0, "delete CQ 2: %s", nvm_strerror(rc));
    }
    free(copy);
    nvm_dma_unmap(gw);
    OK(GSTAT("active_pins") == pins0, "GPU window of the cuMemAlloc memory unmapped: gpusim pins %lld",
       GSTAT("active_pins"));
    rc = cu.mem_free(dptr);
    OK(rc == 0, "cuMemFree: %d", rc);
    cu.ctx_destroy(ctx);
}

int main(int argc, char** argv)
{
    nvm_ctrl_t* ctrl = NULL;
    nvm_aq_ref aq = NULL;
    nvm_dma_t *adm = NULL, *data = NULL, *gwin = NULL;
    struct nvm_ctrl_info info;
    struct nvm_ns_info ns;
    uint16_t nc = 1, ns_ = 1;
    int fd, gs, rc;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2) {
        fprintf(stderr, "usage: %s /dev/libnvmN\n", argv[0]);
        return 2;
    }
    ps = (size_t) sysconf(_SC_PAGESIZE);
    long long pins0 = GSTAT("active_pins"), maps0 = GSTAT("active_dma_mappings");
    MUST(pins0 >= 0 && LSTAT("host_windows") == 0 && LSTAT("gpu_windows") == 0,
         "start: gpusim pins %lld, module holds no window", pins0);

    /* --- controller through the module ------------------------------------------------------ */
    fd = open(argv[1], O_RDWR);
    MUST(fd >= 0, "open %s: %s", argv[1], strerror(errno));
    rc = nvm_ctrl_init(&ctrl, fd);
    MUST(rc == 0 && ctrl != NULL, "nvm_ctrl_init(%s): %s", argv[1], nvm_strerror(rc));
    close(fd); /* the library holds its own descriptor */
    OK(ctrl->page_size == ps && ctrl->mm_size == 0x2000 && ctrl->max_entries == 2048 && ctrl->timeout == 7500 &&
       ctrl->dstrd == 0, "controller handle: page %zu, mm_size 0x%zx, max_entries %u, timeout %llu ms",
       ctrl->page_size, ctrl->mm_size, ctrl->max_entries, (unsigned long long) ctrl->timeout);
    OK(*(volatile uint32_t*) ((volatile char*) ctrl->mm_ptr + 8) == 0x10400, "VS through the module's BAR0 mapping");

    /* --- admin queue on module-pinned host memory ---------------------------------------------- */
    void* admva = host_pages(3);
    MUST(admva != NULL, "admin memory");
    rc = nvm_dma_map_host(&adm, ctrl, admva, 3 * ps);
    MUST(rc == 0 && adm->n_ioaddrs == 3 && adm->page_size == ps && adm->vaddr == admva,
         "nvm_dma_map_host admin window (3 pages): %s", nvm_strerror(rc));
    OK(LSTAT("host_windows") == 1 && LSTAT("host_pages") == 3 && adm->ioaddrs[0] && !(adm->ioaddrs[0] % ps),
       "module counts 1 host window of 3 pages; ioaddr 0x%llx", (unsigned long long) adm->ioaddrs[0]);
    rc = nvm_aq_create(&aq, ctrl, adm);
    MUST(rc == 0, "nvm_aq_create (reset, enable): %s", nvm_strerror(rc));
    OK(*(volatile uint32_t*) ((volatile char*) ctrl->mm_ptr + 0x1c) & 1, "CSTS.RDY after nvm_aq_create");

    rc = nvm_admin_ctrl_info(aq, &info, NVM_DMA_OFFSET(adm, 2), adm->ioaddrs[2]);
    OK(rc == 0 && info.nvme_version == 0x10400 && memcmp(info.model_no, "QEMU NVMe Ctrl", 14) == 0 &&
       memcmp(info.serial_no, "gpudirect-rs", 12) == 0 && info.max_data_size == 524288,
       "identify controller: %.40s / %.20s, version %x, mdts %zu", info.model_no, info.serial_no, info.nvme_version,
       info.max_data_size);
    rc = nvm_admin_ns_info(aq, &ns, 1, NVM_DMA_OFFSET(adm, 2), adm->ioaddrs[2]);
    MUST(rc == 0 && ns.lba_data_size == 512 && ns.size >= 2048, "identify namespace 1: %llu blocks of %zu: %s",
         (unsigned long long) ns.size, ns.lba_data_size, nvm_strerror(rc));
    rc = nvm_admin_request_num_queues(aq, &nc, &ns_);
    OK(rc == 0 && nc >= 1 && ns_ >= 1, "request queues: %u CQ, %u SQ: %s", nc, ns_, nvm_strerror(rc));

    /* --- I/O queue pair ------------------------------------------------------------------------ */
    void* qva = host_pages(3);
    MUST(qva != NULL, "queue memory");
    rc = nvm_dma_map_host(&qwin, ctrl, qva, 3 * ps);
    MUST(rc == 0, "nvm_dma_map_host queue window: %s", nvm_strerror(rc));
    rc = nvm_admin_cq_create(aq, &cq, 1, NVM_DMA_OFFSET(qwin, 0), qwin->ioaddrs[0]);
    MUST(rc == 0, "create CQ 1 (%u entries): %s", cq.max_entries, nvm_strerror(rc));
    rc = nvm_admin_sq_create(aq, &sq, &cq, 1, NVM_DMA_OFFSET(qwin, 1), qwin->ioaddrs[1]);
    MUST(rc == 0, "create SQ 1 (%u entries): %s", sq.max_entries, nvm_strerror(rc));

    /* --- reads into module-pinned host memory -------------------------------------------------- */
    const size_t npg = 16;
    void* dva = host_pages(npg);
    MUST(dva != NULL, "data memory");
    rc = nvm_dma_map_host(&data, ctrl, dva, npg * ps);
    MUST(rc == 0 && data->n_ioaddrs == npg, "nvm_dma_map_host data window (%zu pages): %s", npg, nvm_strerror(rc));
    rc = read_into(64, (uint16_t) (2 * ps / 512), data->ioaddrs, 2);
    OK(rc == 0 && check(dva, 2 * ps, 64 * 512), "read 2 pages at LBA 64 into host memory (PRP1+PRP2): %s",
       nvm_strerror(rc));
    memset(dva, 0, npg * ps);
    rc = read_into(5000, (uint16_t) (npg * ps / 512), data->ioaddrs, npg);
    OK(rc == 0 && check(dva, npg * ps, 5000ULL * 512), "read %zu pages at LBA 5000 into host memory (PRP list): %s",
       npg, nvm_strerror(rc));

    /* --- reads into gpusim GPU memory through nvm_dma_map_device ------------------------------- */
    gs = open("/dev/gpusim", O_RDWR | O_CLOEXEC);
    MUST(gs >= 0, "open /dev/gpusim: %s", strerror(errno));
    struct gpusim_info gi;
    MUST(ioctl(gs, GPUSIM_IOC_INFO, &gi) == 0, "GPUSIM_IOC_INFO: %s", strerror(errno));
    const size_t gsz = 4 * GPG;
    struct gpusim_alloc ga = { .size = gsz };
    MUST(ioctl(gs, GPUSIM_IOC_ALLOC, &ga) == 0, "gpusim alloc %zu bytes: %s", gsz, strerror(errno));
    volatile uint8_t* gmem = mmap(NULL, gsz, PROT_READ | PROT_WRITE, MAP_SHARED, gs, (off_t) ga.gpu_va);
    MUST(gmem != MAP_FAILED, "mmap gpusim memory: %s", strerror(errno));
    for (size_t i = 0; i < gsz; i += 8) {
        *(volatile uint64_t*) (gmem + i) = FILL;
    }
    rc = nvm_dma_map_device(&gwin, ctrl, (void*) (uintptr_t) ga.gpu_va, gsz);
    MUST(rc == 0 && gwin->page_size == ps && gwin->n_ioaddrs == gsz / ps,
         "nvm_dma_map_device %zu KiB at GPU VA 0x%llx: %s (%zu ioaddrs of %zu)", gsz >> 10,
         (unsigned long long) ga.gpu_va, nvm_strerror(rc), gwin ? gwin->n_ioaddrs : 0, gwin ? gwin->page_size : 0);
    int inbar = 1;
    for (size_t i = 0; i < gwin->n_ioaddrs; ++i) {
        inbar &= gwin->ioaddrs[i] >= gi.bar_phys && gwin->ioaddrs[i] + ps <= gi.bar_phys + gi.bar_size;
    }
    OK(inbar && GSTAT("active_pins") == pins0 + 1 && LSTAT("gpu_windows") == 1 && LSTAT("gpu_pages") == 4,
       "GPU window: %zu bus addresses inside the gpusim BAR, gpusim pins %lld, module gpu pages %lld",
       gwin->n_ioaddrs, GSTAT("active_pins"), LSTAT("gpu_pages"));

    /* 16 controller pages from the middle of GPU page 0 into GPU page 1 (a PRP list). */
    const size_t first = GPG / ps / 2, n = 16;
    rc = read_into(9000, (uint16_t) (n * ps / 512), gwin->ioaddrs + first, n);
    OK(rc == 0 && check(gmem + first * ps, n * ps, 9000ULL * 512),
       "read %zu pages at LBA 9000 into GPU memory across a 64 KiB GPU page (PRP list), checked through gpusim: %s",
       n, nvm_strerror(rc));
    OK(all_fill(gmem, first * ps) && all_fill(gmem + (first + n) * ps, gsz - (first + n) * ps),
       "GPU memory outside the read untouched");
    /* 2 pages at the start of GPU page 3 (PRP1+PRP2). */
    rc = read_into(128, (uint16_t) (2 * ps / 512), gwin->ioaddrs + 3 * GPG / ps, 2);
    OK(rc == 0 && check(gmem + 3 * GPG, 2 * ps, 128 * 512), "read 2 pages at LBA 128 into GPU page 3: %s",
       nvm_strerror(rc));

    gpu_queue_tests(aq, ctrl, &gi, data, dva, GSTAT("active_pins"));

    /* --- teardown --------------------------------------------------------------------------- */
    rc = nvm_admin_sq_delete(aq, &sq, &cq);
    OK(rc == 0, "delete SQ 1: %s", nvm_strerror(rc));
    rc = nvm_admin_cq_delete(aq, &cq);
    OK(rc == 0, "delete CQ 1: %s", nvm_strerror(rc));
    nvm_dma_unmap(gwin);
    OK(GSTAT("active_pins") == pins0 && GSTAT("active_dma_mappings") == maps0 && LSTAT("gpu_windows") == 0,
       "nvm_dma_unmap of the GPU window: gpusim pins %lld (was %lld), module gpu windows %lld", GSTAT("active_pins"),
       pins0, LSTAT("gpu_windows"));
    munmap((void*) gmem, gsz);
    struct gpusim_free gf = { .gpu_va = ga.gpu_va };
    OK(ioctl(gs, GPUSIM_IOC_FREE, &gf) == 0, "gpusim free: %s", strerror(errno));
    close(gs);
    nvm_dma_unmap(data);
    nvm_dma_unmap(qwin);
    nvm_aq_destroy(aq);
    nvm_dma_unmap(adm);
    nvm_ctrl_free(ctrl);
    OK(LSTAT("host_windows") == 0 && LSTAT("host_pages") == 0 && LSTAT("gpu_windows") == 0 &&
       GSTAT("active_pins") == pins0, "after free: module holds host %lld/%lld gpu %lld, gpusim pins %lld",
       LSTAT("host_windows"), LSTAT("host_pages"), LSTAT("gpu_windows"), GSTAT("active_pins"));
    free(admva);
    free(qva);
    free(dva);
    printf("# %d failure(s)\n", check_failures);
    return check_failures ? 1 : 0;
}
